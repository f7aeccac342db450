"""A bound on every test (a pytest plugin, loaded by tests/conftest.py): a test still running
after :data:`TEST_TIMEOUT_SECONDS` interrupts the run, as Ctrl-C would, so that pytest reports
which test it was and where it stood, and fails, rather than hanging for good.

Commands a test runs as subprocesses have timeouts of their own; this bound is for what runs
in-process (click's ``CliRunner``, a server a test starts) and for the hangs nobody foresaw.
``INTURN_TEST_TIMEOUT_SECONDS`` sets it (default 1,800 s: longer than the longest command a test
runs, the image build's 1,500 s, so that only a hang reaches it).
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

#: The longest one test may take, setup and teardown included, seconds.
TEST_TIMEOUT_SECONDS = float(os.environ.get("INTURN_TEST_TIMEOUT_SECONDS") or 1800)


def _interrupt(item: pytest.Item) -> None:
    said = f"{item.nodeid}: still running after {TEST_TIMEOUT_SECONDS:g} s: interrupting the run"
    plugins = item.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is not None and capture is not None:  # to the terminal, past the test's capture
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            reporter.write_line(said, red=True)
    # a real signal, at the main thread (where the test runs): it wakes a blocked sleep or
    # select() there, which a signal taken by this timer's thread would not
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


def pytest_configure(config: pytest.Config) -> None:
    """Make SIGINT interrupt this process even when it was started with SIGINT ignored: a shell
    starts a background job (``make test &``, a CI step, ``nohup``) so, Python then keeps it
    ignored, and the bound's signal would be lost (the hanging test ran its 600 s out)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """Run ``item`` with a timer that interrupts the run when it outlasts the bound."""
    watchdog = threading.Timer(TEST_TIMEOUT_SECONDS, _interrupt, args=(item,))
    watchdog.daemon = True
    watchdog.start()
    try:
        return (yield)
    finally:
        watchdog.cancel()
