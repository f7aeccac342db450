-- The sweeper's reservation rules: what is due because time passed. The due-date predicates
-- are here, not in a loop over recent rows, so the most overdue records come first whatever
-- the table holds, and LIMIT drops the least urgent. %(at)s is NULL in production (database
-- now()); tests may pin it. A record already on the worklist for the same trigger (an item
-- pending, or cleared since the trigger) is not selected: it must not use up the limit, and a
-- person who cleared it is not handed it again for the same request or deadline.

-- name: unanswered_due
-- Segments waiting for a reply longer than pending_after (seconds), oldest request first.
SELECT s.locator, s.number, s.carrier, s.flight, s.status, b.owner,
       coalesce(s.requested_at, s.status_changed_at) AS requested
  FROM inturn_segment s
  JOIN inturn_booking b ON b.locator = s.locator
 WHERE s.status IN ('HN', 'NN', 'PN')
   AND b.cancelled_at IS NULL
   AND coalesce(s.requested_at, s.status_changed_at)
       <= coalesce(%(at)s::timestamptz, now())
          - make_interval(secs => %(pending_after)s::double precision)
   AND NOT EXISTS (
       SELECT 1 FROM inturn_worklist_item w
        WHERE w.record_kind = 'segment' AND w.record_key = s.locator || '/' || s.number
          AND w.reason = 'unanswered'
          AND (w.state = 'pending'
               OR w.placed_at >= coalesce(s.requested_at, s.status_changed_at)))
 ORDER BY coalesce(s.requested_at, s.status_changed_at), s.locator, s.number
 LIMIT %(limit)s;

-- name: unanswered_stale
-- Pending "unanswered" items whose segment is no longer waiting (answered, cancelled, gone).
SELECT w.record_key
  FROM inturn_worklist_item w
  LEFT JOIN inturn_segment s ON w.record_key = s.locator || '/' || s.number
  LEFT JOIN inturn_booking b ON b.locator = s.locator
 WHERE w.state = 'pending' AND w.record_kind = 'segment' AND w.reason = 'unanswered'
   AND (s.locator IS NULL OR s.status NOT IN ('HN', 'NN', 'PN') OR b.cancelled_at IS NOT NULL)
 ORDER BY w.id;

-- name: ticketing_due
-- Open bookings whose deadline is within lead (seconds) and not yet passed, soonest first.
SELECT b.locator, b.owner, b.ticketing_deadline
  FROM inturn_booking b
 WHERE NOT b.ticketed AND b.cancelled_at IS NULL AND b.ticketing_deadline IS NOT NULL
   AND b.ticketing_deadline > coalesce(%(at)s::timestamptz, now())
   AND b.ticketing_deadline <= coalesce(%(at)s::timestamptz, now())
                               + make_interval(secs => %(lead)s::double precision)
   AND NOT EXISTS (
       SELECT 1 FROM inturn_worklist_item w
        WHERE w.record_kind = 'booking' AND w.record_key = b.locator
          AND w.reason = 'ticketing-due'
          AND (w.state = 'pending'
               OR w.placed_at >= b.ticketing_deadline
                                 - make_interval(secs => %(lead)s::double precision)))
 ORDER BY b.ticketing_deadline, b.locator
 LIMIT %(limit)s;

-- name: ticketing_expired
-- Open bookings past their deadline, most overdue first.
SELECT b.locator, b.owner, b.ticketing_deadline
  FROM inturn_booking b
 WHERE NOT b.ticketed AND b.cancelled_at IS NULL AND b.ticketing_deadline IS NOT NULL
   AND b.ticketing_deadline <= coalesce(%(at)s::timestamptz, now())
   AND NOT EXISTS (
       SELECT 1 FROM inturn_worklist_item w
        WHERE w.record_kind = 'booking' AND w.record_key = b.locator
          AND w.reason = 'ticketing-expired'
          AND (w.state = 'pending' OR w.placed_at >= b.ticketing_deadline))
 ORDER BY b.ticketing_deadline, b.locator
 LIMIT %(limit)s;

-- name: ticketing_stale
-- Pending ticketing items whose condition no longer holds, with why: the booking was ticketed
-- or cancelled by someone else, its deadline moved out of the window, or (for ticketing-due)
-- the deadline passed and ticketing-expired takes over. An auto-cancelled booking keeps its
-- ticketing-expired item: it tells the owner what happened.
SELECT w.record_key, w.reason,
       CASE WHEN b.locator IS NULL THEN 'booking deleted'
            WHEN b.ticketed THEN 'ticketed'
            WHEN b.cancelled_at IS NOT NULL THEN 'booking cancelled'
            WHEN b.ticketing_deadline IS NULL THEN 'no ticketing deadline'
            WHEN w.reason = 'ticketing-due'
                 AND b.ticketing_deadline <= coalesce(%(at)s::timestamptz, now())
                 THEN 'deadline passed'
            ELSE 'deadline extended' END AS why
  FROM inturn_worklist_item w
  LEFT JOIN inturn_booking b ON b.locator = w.record_key
 WHERE w.state = 'pending' AND w.record_kind = 'booking'
   AND w.reason IN ('ticketing-due', 'ticketing-expired')
   AND (b.locator IS NULL OR b.ticketed OR b.ticketing_deadline IS NULL
        OR (b.cancelled_at IS NOT NULL
            AND NOT (w.reason = 'ticketing-expired'
                     AND b.cancel_reason = 'ticketing-expired'))
        OR (w.reason = 'ticketing-due'
            AND (b.ticketing_deadline <= coalesce(%(at)s::timestamptz, now())
                 OR b.ticketing_deadline > coalesce(%(at)s::timestamptz, now())
                                           + make_interval(secs => %(lead)s::double precision)))
        OR (w.reason = 'ticketing-expired'
            AND b.cancelled_at IS NULL
            AND b.ticketing_deadline > coalesce(%(at)s::timestamptz, now())))
 ORDER BY w.id;

-- name: pending_count
-- Pending items of one reason on records of one kind: the "already there" of a rule's summary.
SELECT count(*) AS n
  FROM inturn_worklist_item
 WHERE state = 'pending' AND record_kind = %(record_kind)s AND reason = %(reason)s;
