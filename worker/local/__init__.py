"""``inturn local``: every component but the operator in one process, on an embedded
Postgres (:mod:`.embedded`), from Destination manifests on disk (:mod:`.manifests`), run by
:mod:`.run`; its command line is :mod:`inturn.worker.cli.local`.

Layer: front end. It starts the other front ends in one process; only its command imports it.
"""
