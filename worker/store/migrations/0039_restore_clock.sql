-- The database's clock (issue 39, part 1): one row whose tick only the operator moves, once a
-- minute. A restored database (a dump, a base backup, point-in-time recovery, a replica that
-- had not received the last ticks) holds an older tick than the one the operator recorded in
-- each Destination's status: that is how inturn notices that its database went back in time.
CREATE TABLE inturn_clock (
    one   boolean     PRIMARY KEY DEFAULT true CHECK (one),
    tick  bigint      NOT NULL DEFAULT 0,
    at    timestamptz NOT NULL DEFAULT now()
);
INSERT INTO inturn_clock (one) VALUES (true);
