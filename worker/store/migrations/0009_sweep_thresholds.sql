-- What the sweeper needs to know about each destination, written with the registry row from
-- the Destination's spec: how long its head may wait before it is raised as stuck
-- (spec.alerting.stuckAfterSeconds), and whether and when its pending messages expire
-- (spec.expireAfterSeconds; NULL: never, the default, since expiring clinical messages must be
-- chosen).
ALTER TABLE inturn_destination
    ADD COLUMN stuck_after_seconds  integer NOT NULL DEFAULT 900 CHECK (stuck_after_seconds > 0),
    ADD COLUMN expire_after_seconds integer CHECK (expire_after_seconds > 0);
