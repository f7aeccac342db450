"""Helpers the tests share, as one package: import them as ``from tests.support.pipeline import
...`` (pytest puts the repository's root on ``sys.path``: ``pythonpath`` in ``pyproject.toml``;
a benchmark inserts it itself). A test module never imports another test module: what two
test modules share lives here, and their shared fixtures in a ``conftest.py``.

- :mod:`tests.support.db`: databases of a test's own, the session database emptied from the
  catalog, destinations registered as the operator registers them;
- :mod:`tests.support.pipeline`: registry rows, workers started and stopped (their
  configuration, retry and lease settings), a message given up as a worker does, counts of
  delivery rows, MSH-10s, the CLI, ``until``;
- :mod:`tests.support.lab`: the worker tests' destination ``ward/lab`` and its numbered messages;
- :mod:`tests.support.ingest`: ingest's configuration, a running ingest, its MLLP client, HTTP
  posts, small messages and batches;
- :mod:`tests.support.manifests`: Destination manifests as plain dicts;
- :mod:`tests.support.console`: the console's roles, clients and seeded work;
- :mod:`tests.support.local`: a live ``inturn local`` (or ``inturn worker``) subprocess,
  manifest files, MLLP sends (our own client and python-hl7's ``mllp_send``);
- :mod:`tests.support.helm_chart`, :mod:`tests.support.prometheus_rules`: the chart rendered by
  the real Helm, its alert rules as Prometheus reads them;
- :mod:`tests.support.pgcluster`, :mod:`tests.support.netpart`: a primary and a standby
  Postgres, network partitions between namespaces (and the split destination's worker);
  :mod:`tests.support.pgbouncer`: a real PgBouncer in front of it;
- :mod:`tests.support.keys`: payload encryption's key store and master keys, dumps and
  restores;
- :mod:`tests.support.watchdog`: the bound on every test (a pytest plugin);
- :mod:`tests.support.sftp_server`, :mod:`tests.support.booking_data`: a real SFTP server,
  bookings in the import file's shape;
- :mod:`tests.support.image_check`: the image's own check script, as a module.
"""
