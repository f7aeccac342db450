-- The console's day picture of a destination marks its failed attempts of the last day
-- (queue.sql: destination_attempts): an index on the attempt time lets that query read only
-- the day's attempts instead of the whole history.
CREATE INDEX inturn_attempt_at ON inturn_attempt (at);
