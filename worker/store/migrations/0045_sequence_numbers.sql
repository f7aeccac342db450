-- MSH-13 sequence numbers of a receiver profile (issue 42: spec.profile.sequenceNumbers, the
-- HL7 v2 sequence number protocol, chapter 2). A destination's counter, and the number each
-- of its messages was given at its first send; a retry of the message, after a restart, a
-- takeover or on another lane, sends the same number again, and no number is given twice.
-- The worker reserves a number (delivery.reserve_sequence, lease-guarded) only once the
-- profile has shaped the message: a message its profile refuses spends none.
CREATE TABLE inturn_sequence (
    destination  text   PRIMARY KEY,
    last         bigint NOT NULL CHECK (last >= 1)
);

-- A finished row leaving the hot table (history, purge, erasure) takes its number with it:
-- only a pending message's retry needs it.
CREATE TABLE inturn_sequence_number (
    item_id      bigint PRIMARY KEY REFERENCES inturn_delivery (id) ON DELETE CASCADE,
    destination  text   NOT NULL,
    number       bigint NOT NULL CHECK (number >= 1),
    UNIQUE (destination, number)
);

-- Row-level security as on the worker's other tables (migration 0036): every role keeps what
-- its grants give it, and --create-roles adds the worker's restrictive policy.
ALTER TABLE inturn_sequence ENABLE ROW LEVEL SECURITY;
CREATE POLICY inturn_granted ON inturn_sequence USING (true) WITH CHECK (true);
ALTER TABLE inturn_sequence_number ENABLE ROW LEVEL SECURITY;
CREATE POLICY inturn_granted ON inturn_sequence_number USING (true) WITH CHECK (true);
