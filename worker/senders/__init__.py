"""Senders: the one contract a worker drains through, with MLLP and HTTP implementations.

Layer: core, beside the Destination API (``spec``), below the store's users: the only code
that talks to receivers. It may use ``spec`` (schema nodes) and hl7.
"""
