"""Orders and their results: ``spec.replies`` expectations, recorded by the worker when an
order is delivered and answered by ingest when its reply is stored; the sweeper's ``orders``
pack (``unanswered-order``) raises an order whose reply did not come in time."""
