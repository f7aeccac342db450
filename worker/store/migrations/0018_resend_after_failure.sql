-- A message received again (the same channel, MSH-10 and bytes inside the duplicate window) is
-- a duplicate only while its earlier copy is pending or was delivered a short while ago (a
-- sender that lost our ACK); otherwise it is queued again as a re-send, linked to that copy
-- (resent_from / resent_as, as `queue resend` links them). See ingest.sql, `store`.
-- repeats: how many times the message was received again since its row was written (0 for a
-- new message). Counting each copy makes a concurrent one visible: a copy whose count another
-- transaction raised after this one's snapshot is arriving at the same moment, and is not
-- queued twice. A constant default: no table rewrite.
ALTER TABLE inturn_received ADD COLUMN repeats integer NOT NULL DEFAULT 0;
