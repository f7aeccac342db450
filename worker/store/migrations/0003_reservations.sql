-- Reservation records: bookings and their flight segments, the history of every status a
-- partner sent for a segment, and which Destination serves which carrier.

-- One booking (a PNR), keyed by its record locator.
CREATE TABLE inturn_booking (
    locator                  text        PRIMARY KEY,
    owner                    text        NOT NULL,       -- the office that made it (originator)
    created_at               timestamptz NOT NULL,
    ticketing_deadline       timestamptz,                -- the instant, normalised to UTC
    ticketing_deadline_text  text,                       -- the text it was read from, as given
    ticketed                 boolean     NOT NULL DEFAULT false,
    ticket_numbers           text[]      NOT NULL DEFAULT '{}',
    cancelled_at             timestamptz,
    cancel_reason            text,                       -- e.g. ticketing-expired
    imported_at              timestamptz NOT NULL DEFAULT now(),
    updated_at               timestamptz NOT NULL DEFAULT now(),
    CHECK ((cancelled_at IS NULL) = (cancel_reason IS NULL))
);
-- The sweeper's ticketing rules: open bookings by deadline, most overdue first.
CREATE INDEX inturn_booking_ticketing ON inturn_booking (ticketing_deadline, locator)
    WHERE NOT ticketed AND cancelled_at IS NULL AND ticketing_deadline IS NOT NULL;

-- One flight segment of a booking.
CREATE TABLE inturn_segment (
    locator            text        NOT NULL REFERENCES inturn_booking ON DELETE CASCADE,
    number             integer     NOT NULL CHECK (number BETWEEN 1 AND 99),
    carrier            text        NOT NULL,             -- IATA airline designator, e.g. LH
    flight             text        NOT NULL,             -- flight number, e.g. 400
    date               date        NOT NULL,             -- departure date (local to origin)
    origin             text        NOT NULL,             -- IATA airport code
    destination        text        NOT NULL,
    status             text        NOT NULL,             -- AIRIMP status code, e.g. HK, HN
    requested_at       timestamptz,                      -- when we asked the carrier for space
    status_changed_at  timestamptz NOT NULL,
    PRIMARY KEY (locator, number)
);
-- The sweeper's "unanswered" rule: segments still waiting for a reply, oldest request first.
CREATE INDEX inturn_segment_requested ON inturn_segment
    ((coalesce(requested_at, status_changed_at)), locator, number)
    WHERE status IN ('HN', 'NN', 'PN');

-- Every status a partner sent for a segment, applied or not: the record of who said what when.
CREATE TABLE inturn_segment_event (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    locator      text        NOT NULL,
    number       integer     NOT NULL,
    code         text        NOT NULL,                   -- as received
    previous     text        NOT NULL,                   -- the segment's status before
    result       text        NOT NULL,                   -- its status after (= previous if late)
    outcome      text        NOT NULL CHECK (outcome IN ('applied', 'late', 'withdrawn')),
    received_at  timestamptz NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (locator, number) REFERENCES inturn_segment ON DELETE CASCADE
);
CREATE INDEX inturn_segment_event_segment ON inturn_segment_event (locator, number, id);

-- Which live Destination serves a carrier: at most one, enforced by the primary key. A row
-- belongs to a registered destination and goes when that destination is marked deleted.
CREATE TABLE inturn_destination_carrier (
    carrier      text        PRIMARY KEY,
    destination  text        NOT NULL REFERENCES inturn_destination ON DELETE CASCADE,
    claimed_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX inturn_destination_carrier_destination ON inturn_destination_carrier (destination);
