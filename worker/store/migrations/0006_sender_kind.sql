-- The sender kind of each destination ("mllp", "http", ...), so that ingest can refuse at the
-- door a message that a destination it is routed to could never send (0x0B or 0x1C inside the
-- payload of a message for an MLLP destination). NULL for rows written before this column:
-- nothing is refused for them until the operator (or inturn local) registers them again.
ALTER TABLE inturn_destination ADD COLUMN sender_kind text;
