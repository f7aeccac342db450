"""The Destination API: the schema that generates the CRD and its CEL rules
(:mod:`.schema`, :mod:`.openapi`), the parsed spec (:mod:`.destination`) and the worker's
configuration (:mod:`.config`). Pure: no I/O library.

Layer: core (with ``senders``). It may use senders (each kind's schema node) and hl7; the
store names nothing of it but the pure schedule helpers.
"""
