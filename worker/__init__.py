"""inturn worker side: the delivery queue, its worker, senders, ingest and the command line."""
