// Live ages and countdowns (ours, no dependency). Every <time data-live="since|until"
// datetime="ISO 8601"> is rewritten each second: "since" shows how long ago that instant was
// (an age: 45s, 12m, 3h05m, 2d04h, as the server writes them), "until" how long until it
// ("in 12s", "now"). The page's <meta name="server-time"> corrects for this browser's clock.
(function () {
  "use strict";
  var meta = document.querySelector('meta[name="server-time"]');
  var skew = meta ? Date.parse(meta.getAttribute("content")) - Date.now() : 0;
  if (isNaN(skew)) { skew = 0; }

  function pad(n) { return (n < 10 ? "0" : "") + n; }

  function age(seconds) {
    var s = Math.max(0, Math.floor(seconds));
    if (s < 120) { return s + "s"; }
    if (s < 7200) { return Math.floor(s / 60) + "m"; }
    if (s < 172800) { return Math.floor(s / 3600) + "h" + pad(Math.floor((s % 3600) / 60)) + "m"; }
    return Math.floor(s / 86400) + "d" + pad(Math.floor((s % 86400) / 3600)) + "h";
  }

  function tick() {
    var now = Date.now() + skew;
    var nodes = document.querySelectorAll("time[data-live]");
    for (var i = 0; i < nodes.length; i++) {
      var el = nodes[i];
      var at = Date.parse(el.getAttribute("datetime"));
      if (isNaN(at)) { continue; }
      if (el.getAttribute("data-live") === "since") {
        el.textContent = age((now - at) / 1000);
      } else {
        var left = (at - now) / 1000;
        el.textContent = left <= 0 ? "now" : "in " + age(left);
      }
    }
  }

  tick();
  setInterval(tick, 1000);
  document.addEventListener("htmx:afterSwap", tick);
}());
