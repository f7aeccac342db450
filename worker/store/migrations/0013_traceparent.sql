-- The W3C trace context (traceparent) of the message's receive span, written by ingest when
-- tracing is on (inturn.worker.tracing) so that the worker's attempt spans join the same trace.
-- NULL when the message was not traced. Adding a nullable column without a default rewrites
-- nothing.
ALTER TABLE inturn_delivery ADD COLUMN traceparent text;
