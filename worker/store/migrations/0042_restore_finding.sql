-- A restore's finding, kept in the restored database until a person decides (issue 39, part 1).
--
-- The operator notices a restore from the Destination's witness (its status, outside the
-- database) and writes here, per destination, what the witness said before the restore: its
-- last delivered row's id, that row's message in the channel log, and when it was delivered.
-- `inturn queue mark-delivered` reads it: it marks delivered only messages accepted no later
-- than that delivery (a message accepted after the restore may have been given an id the
-- database had used before it: ids are drawn from sequences the restore took back too), and
-- the slim rows pulled again after the restore by their log message, whatever their new ids.
-- The operator removes the row once the hold is lifted.
CREATE TABLE inturn_restore (
    destination        text        PRIMARY KEY,
    detected_at        timestamptz NOT NULL DEFAULT now(),
    tick               bigint      NOT NULL,
    delivered_through  bigint,      -- its last delivered row's id, before the restore
    delivered_message  bigint,      -- the log message of its last delivered slim row
    delivered_at       timestamptz  -- when that last delivery was made
);
