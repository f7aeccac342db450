"""``inturn local``: every component but the operator in one process, on an embedded
Postgres (:mod:`.embedded`), from Destination manifests on disk (:mod:`.run`).

Layer: front end. It starts the other front ends in one process; nothing imports it.
"""
