-- Lanes (spec.lanes.count): the registry carries how many messages each destination may have
-- in flight at once, so that the console, `inturn queue depth` and the sweeper can show what
-- its lanes hold. 1 is the single stream. A constant default: no table rewrite.
ALTER TABLE inturn_destination ADD COLUMN lanes integer NOT NULL DEFAULT 1
    CHECK (lanes BETWEEN 1 AND 32);
