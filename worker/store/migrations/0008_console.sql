-- The console's additions to the registry.
--
-- A hold: a person suspended delivery for a destination from the console or `inturn queue
-- suspend`. It is kept apart from `suspended` (the Destination's spec.suspend, written by the
-- operator on every reconcile) so that neither overwrites the other. A worker honours both: the
-- head query returns nothing while a hold is set, and a resume wakes the worker.
ALTER TABLE inturn_destination
    ADD COLUMN held_at  timestamptz,
    ADD COLUMN held_by  text,
    ADD COLUMN held_why text,
    -- A one-line, credential-free description of the sender (mllp://host:port, an URL without
    -- user info), for listings.
    ADD COLUMN sender   text NOT NULL DEFAULT '';

-- Every failed attempt of a delivery: when, which attempt, and the error (class and detail,
-- never a payload). A successful attempt is the item's own delivered state. Deleted with its item.
-- Attempt numbers can repeat (a retry by hand resets the count), so rows are ordered by id.
CREATE TABLE inturn_attempt (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item_id  bigint      NOT NULL REFERENCES inturn_delivery (id) ON DELETE CASCADE,
    attempt  integer     NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    outcome  text        NOT NULL,  -- retry (backing off) or failed (given up)
    error    text
);
CREATE INDEX inturn_attempt_item ON inturn_attempt (item_id, id);
