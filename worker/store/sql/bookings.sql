-- Reservation records (tables inturn_booking, inturn_segment, inturn_segment_event) and the
-- carrier -> Destination lookup used by cancellation notices. Times compared with due dates
-- are database time: %(at)s is NULL in production (now()); tests may pin it.

-- name: upsert_booking
-- Insert or update one booking from an import; only a real change writes. A cancellation is
-- never undone by an import. Returns a row when written, with created = true when inserted.
INSERT INTO inturn_booking
       (locator, owner, created_at, ticketing_deadline, ticketing_deadline_text, ticketed,
        ticket_numbers)
VALUES (%(locator)s, %(owner)s, %(created_at)s, %(ticketing_deadline)s,
        %(ticketing_deadline_text)s, %(ticketed)s, %(ticket_numbers)s::text[])
ON CONFLICT (locator) DO UPDATE
   SET owner = EXCLUDED.owner,
       created_at = EXCLUDED.created_at,
       ticketing_deadline = EXCLUDED.ticketing_deadline,
       ticketing_deadline_text = EXCLUDED.ticketing_deadline_text,
       ticketed = EXCLUDED.ticketed,
       ticket_numbers = EXCLUDED.ticket_numbers,
       updated_at = now()
 WHERE (inturn_booking.owner, inturn_booking.created_at, inturn_booking.ticketing_deadline,
        inturn_booking.ticketing_deadline_text, inturn_booking.ticketed,
        inturn_booking.ticket_numbers)
       IS DISTINCT FROM
       (EXCLUDED.owner, EXCLUDED.created_at, EXCLUDED.ticketing_deadline,
        EXCLUDED.ticketing_deadline_text, EXCLUDED.ticketed, EXCLUDED.ticket_numbers)
RETURNING (xmax = 0) AS created;

-- name: upsert_segment
-- Insert or update one segment from an import; only a real change writes, and the status
-- change time moves only when the status does.
INSERT INTO inturn_segment
       (locator, number, carrier, flight, date, origin, destination, status, requested_at,
        status_changed_at)
VALUES (%(locator)s, %(number)s, %(carrier)s, %(flight)s, %(date)s, %(origin)s,
        %(destination)s, %(status)s, %(requested_at)s, now())
ON CONFLICT (locator, number) DO UPDATE
   SET carrier = EXCLUDED.carrier,
       flight = EXCLUDED.flight,
       date = EXCLUDED.date,
       origin = EXCLUDED.origin,
       destination = EXCLUDED.destination,
       status = EXCLUDED.status,
       requested_at = EXCLUDED.requested_at,
       status_changed_at = CASE WHEN inturn_segment.status = EXCLUDED.status
                                THEN inturn_segment.status_changed_at ELSE now() END
 WHERE (inturn_segment.carrier, inturn_segment.flight, inturn_segment.date,
        inturn_segment.origin, inturn_segment.destination, inturn_segment.status,
        inturn_segment.requested_at)
       IS DISTINCT FROM
       (EXCLUDED.carrier, EXCLUDED.flight, EXCLUDED.date, EXCLUDED.origin,
        EXCLUDED.destination, EXCLUDED.status, EXCLUDED.requested_at)
RETURNING number;

-- name: delete_other_segments
-- An import is the booking's whole itinerary: segments it no longer lists go.
DELETE FROM inturn_segment
 WHERE locator = %(locator)s AND NOT (number = ANY (%(numbers)s::integer[]))
RETURNING number;

-- name: get_booking
SELECT locator, owner, created_at, ticketing_deadline, ticketing_deadline_text, ticketed,
       ticket_numbers, cancelled_at, cancel_reason
  FROM inturn_booking
 WHERE locator = %(locator)s;

-- name: get_segments
SELECT number, carrier, flight, date, origin, destination, status, requested_at,
       status_changed_at
  FROM inturn_segment
 WHERE locator = %(locator)s
 ORDER BY number;

-- name: segment_events
-- A booking's status history, oldest first.
SELECT id, number, code, previous, result, outcome, received_at, recorded_at
  FROM inturn_segment_event
 WHERE locator = %(locator)s
 ORDER BY id;

-- name: lock_segment
-- The booking and one segment, locked (booking first, as the cancellation does) until COMMIT.
SELECT b.owner, b.cancelled_at, s.status, s.carrier
  FROM inturn_booking b
  JOIN inturn_segment s ON s.locator = b.locator
 WHERE b.locator = %(locator)s AND s.number = %(number)s
   FOR UPDATE OF b, s;

-- name: set_segment_status
UPDATE inturn_segment
   SET status = %(status)s,
       status_changed_at = coalesce(%(received_at)s::timestamptz, now())
 WHERE locator = %(locator)s AND number = %(number)s;

-- name: record_event
INSERT INTO inturn_segment_event
       (locator, number, code, previous, result, outcome, received_at)
VALUES (%(locator)s, %(number)s, %(code)s, %(previous)s, %(result)s, %(outcome)s,
        coalesce(%(received_at)s::timestamptz, now()));

-- name: lock_booking
-- One open booking, locked until COMMIT, with what the cancellation must re-check.
SELECT locator, owner, ticketed, cancelled_at, ticketing_deadline,
       ticketing_deadline <= coalesce(%(at)s::timestamptz, now()) AS expired
  FROM inturn_booking
 WHERE locator = %(locator)s
   FOR UPDATE;

-- name: withdraw_segments
-- Withdraw every live segment of a booking (status XX) and return what was withdrawn.
UPDATE inturn_segment s
   SET status = %(withdrawn)s, status_changed_at = now()
  FROM inturn_segment old
 WHERE s.locator = %(locator)s
   AND old.locator = s.locator AND old.number = s.number
   AND NOT (s.status = ANY (%(dead)s::text[]))
RETURNING s.number, s.carrier, s.flight, s.date, s.origin, s.destination, old.status AS previous;

-- name: record_withdrawals
INSERT INTO inturn_segment_event (locator, number, code, previous, result, outcome, received_at)
SELECT %(locator)s, number, %(withdrawn)s, previous, %(withdrawn)s, 'withdrawn', now()
  FROM unnest(%(numbers)s::integer[], %(previous)s::text[]) AS w (number, previous);

-- name: mark_cancelled
UPDATE inturn_booking
   SET cancelled_at = now(), cancel_reason = %(reason)s, updated_at = now()
 WHERE locator = %(locator)s AND cancelled_at IS NULL
RETURNING cancelled_at;

-- name: carrier_destinations
-- The live Destination serving each of the given carriers, with its channel.
SELECT c.carrier, d.destination, d.channel
  FROM inturn_destination_carrier c
  JOIN inturn_destination d ON d.destination = c.destination AND d.deleted_at IS NULL
 WHERE c.carrier = ANY (%(carriers)s::text[]);

-- name: enqueue_cancel_notice
-- The cancellation notice of a cancelled booking to one carrier, built and enqueued by the
-- database from the booking record (migration 0017): the sweeper's only way to write a
-- delivery. Returns the delivery id and its destination (an existing notice, if one was made).
SELECT id, destination FROM inturn_enqueue_cancel_notice(%(locator)s, %(carrier)s);
