-- A resend links the failed (or skipped, or delivered) item and the copy queued for it, so that
-- what was resent is shown as such, its failure no longer counts as work for a person, and its
-- delivery-failed worklist item is cleared once a copy is delivered.
-- resent_as: on the original, the id of its copy. resent_from: on the copy, the original's id.
-- Both NULL for everything else (no rewrite: nullable columns without a default).
ALTER TABLE inturn_delivery ADD COLUMN resent_as bigint;
ALTER TABLE inturn_delivery ADD COLUMN resent_from bigint;
-- Following a chain of resends from an original to its latest copy, and back.
CREATE INDEX inturn_delivery_resent_from ON inturn_delivery (resent_from)
    WHERE resent_from IS NOT NULL;
