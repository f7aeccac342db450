"""Ingest: MLLP and HTTP listeners that store a message for every destination, then acknowledge."""
