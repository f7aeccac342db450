-- Payload encryption in use (issue 31, trial 1): one row, written once by the first process
-- that seals a payload here (ingest started with payload keys, `inturn keys encrypt-existing`).
-- Rows sealed with payload keys are indexed under the blind index, which a process without the
-- keys cannot compute: a lookup or an erasure by patient made without them reads this row and
-- refuses, instead of answering that nothing was found. Databases that already hold envelopes
-- (sealed before this migration) get the row now: one scan, here only.
CREATE TABLE inturn_payload_keys (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    since timestamptz NOT NULL DEFAULT clock_timestamp()
);

INSERT INTO inturn_payload_keys (one)
SELECT true
 WHERE EXISTS (
    SELECT 1 FROM inturn_delivery WHERE substring(payload FROM 1 FOR 4) = '\x00696531'::bytea
 );
