"""The web console and its JSON API: ``inturn console`` (see :mod:`.app`)."""
