"""Senders: the one contract a worker drains through, with MLLP and HTTP implementations."""
