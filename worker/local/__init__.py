"""``inturn local``: every component but the operator in one process, on an embedded
Postgres (:mod:`.embedded`), from Destination manifests on disk (:mod:`.run`).
"""
