"""The Postgres store: migrations, the delivery queue, the destination registry, the audit trail.

Layer: the store, the only layer that speaks SQL (statements in ``sql/*.sql``, EXPLAINed by
a test; an import contract keeps ``queries`` here), the only writer of the audit trail
(:func:`.audit.record`) and the only sender of a destination's NOTIFY (:func:`.notify.wake`).
It may use hl7, ``errors``, ``text`` and the pure schedule helpers of ``spec``; it imports no
feature package and not the Destination configuration.
"""
