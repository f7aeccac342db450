-- Filters on HL7 fields (spec.filter.fields): the registry carries each Destination's field
-- conditions (a JSON list, as the spec writes them; NULL: none), so that ingest routes by them
-- as it routes by message_types. A nullable column without a default: no table rewrite.
ALTER TABLE inturn_destination ADD COLUMN filter_fields jsonb;
