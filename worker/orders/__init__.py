"""Orders and their results: ``spec.replies`` expectations, recorded by the worker when an
order is delivered and answered by ingest when its reply is stored; the sweeper's ``orders``
pack (``unanswered-order``) raises an order whose reply did not come in time.

Layer: feature package (a rule pack, independent of the other packs). It may use worklists,
the store, the Destination API and hl7; its SQL runs from ``store/orders.py``.
"""
