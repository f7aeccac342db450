-- A Destination's receiver profile in the registry (issue 42): spec.profile as the spec writes
-- it (NULL: none), so that `inturn queue show`, `inturn queue payload --as-sent` and the
-- console can show what a message is, or was, sent as to that receiver (its profile applied to
-- the stored bytes). The worker reads its profile from its own configuration, not from here.
-- A nullable column without a default: no table rewrite.
ALTER TABLE inturn_destination ADD COLUMN profile jsonb;
