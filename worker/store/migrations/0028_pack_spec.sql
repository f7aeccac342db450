-- The rule packs' other fields of a Destination (issue 32, item 4): what a pack of another
-- distribution declares in spec (a SpecField), as the spec writes them, by name (a JSON
-- object; NULL: none). ingest's routing table hands them to the packs' ingest hooks, as it
-- hands them `replies` (which keeps its own column, as carriers keep their table). A nullable
-- column without a default: no table rewrite.
ALTER TABLE inturn_destination ADD COLUMN pack_spec jsonb;
