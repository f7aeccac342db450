-- The identifier index: finding a message costs what it finds, not the table.
--
-- MSH-10: a hash index on control_id (equality only, any length: a hash index stores 4 bytes
-- per row, so a long control ID can never make an insert fail on an index size limit).
--
-- Patient identifiers (PID-2, PID-3, PID-4, MRG-1; see inturn.worker.hl7.pid): patient_keys
-- holds the message's index keys (128-bit digests, never the identifiers in clear), written in
-- the same statement as the row itself; a GIN index finds the rows holding a key. The keys
-- live in the row, so erasing or purging a message removes its keys with it.
--
-- NULL means "not indexed yet": rows stored before this migration, or by an ingest older than
-- it during a rolling upgrade. `inturn migrate` fills them in (every run, in batches, after the
-- SQL migrations), and erasure by patient also reads their payloads, found by the partial index
-- below, so that nothing stays unfound. None of these columns is ever updated afterwards, so
-- retry and delivered marks stay heap-only (HOT).
ALTER TABLE inturn_delivery ADD COLUMN patient_keys text[];

CREATE INDEX inturn_delivery_control_id ON inturn_delivery USING hash (control_id);
CREATE INDEX inturn_delivery_patient ON inturn_delivery USING gin (patient_keys);
CREATE INDEX inturn_delivery_unindexed ON inturn_delivery (id) WHERE patient_keys IS NULL;
