-- A Destination's delivery window (spec.schedule: a weekly schedule in a time zone, as the
-- spec writes it), registered with the rest of its spec. The sweeper does not count time spent
-- outside it as stuck; queue depth, the console and the status say until when it holds.
-- NULL: no window, messages are sent at any time.
ALTER TABLE inturn_destination ADD COLUMN schedule jsonb;
