"""Helpers the tests share, as one package: import them as ``from tests.support.pipeline import
...`` (pytest puts the repository's root on ``sys.path``: ``pythonpath`` in ``pyproject.toml``;
a benchmark inserts it itself).

- :mod:`tests.support.db`: databases of a test's own, the session database emptied from the
  catalog, destinations registered as the operator registers them;
- :mod:`tests.support.pipeline`: registry rows, workers started and stopped (their
  configuration, retry and lease settings), a message given up as a worker does, counts of
  delivery rows, MSH-10s, the CLI, ``until``;
- :mod:`tests.support.manifests`: Destination manifests as plain dicts;
- :mod:`tests.support.console`: the console's roles, clients and seeded work;
- :mod:`tests.support.local`: a live ``inturn local`` (or ``inturn worker``) subprocess,
  manifest files, MLLP sends;
- :mod:`tests.support.helm_chart`, :mod:`tests.support.prometheus_rules`: the chart rendered by
  the real Helm, its alert rules as Prometheus reads them;
- :mod:`tests.support.pgcluster`, :mod:`tests.support.netpart`: a primary and a standby
  Postgres, network partitions between namespaces; :mod:`tests.support.pgbouncer`: a real
  PgBouncer in front of it;
- :mod:`tests.support.keys`: payload encryption's key store and master keys, dumps and
  restores;
- :mod:`tests.support.watchdog`: the bound on every test (a pytest plugin);
- :mod:`tests.support.sftp_server`, :mod:`tests.support.booking_data`: a real SFTP server,
  bookings in the import file's shape;
- :mod:`tests.support.image_check`: the image's own check script, as a module.
"""
