-- The sweeper's orders pack: unanswered-order. Due-date predicates in database time; the due
-- scan walks the partial index of open, not yet raised expectations (migration 0014), so it
-- reads the rows it places and one more.

-- name: unanswered_due
-- Orders whose reply has not arrived by their due time, most overdue first.
SELECT e.id, e.destination, e.delivery_id, e.control_id, e.message_type, e.order_key, e.reply_channel,
       e.reply_types, e.delivered_at, e.due_at,
       extract(epoch FROM now() - e.due_at)::float8 AS overdue_seconds
  FROM inturn_order_expectation e
 WHERE e.answered_at IS NULL AND e.raised_at IS NULL AND e.due_at <= now()
 ORDER BY e.due_at, e.id
 LIMIT %(limit)s;

-- name: mark_raised
-- In the placing transaction: these expectations are on the worklist now.
UPDATE inturn_order_expectation SET raised_at = now()
 WHERE id = ANY (%(ids)s::bigint[]) AND raised_at IS NULL;

-- name: unanswered_stale
-- Pending unanswered-order items whose reply arrived since, or whose order is gone (erased).
SELECT w.record_key,
       CASE WHEN e.id IS NULL THEN 'the order is gone (erased)'
            ELSE 'its reply arrived' END AS why
  FROM inturn_worklist_item w
  LEFT JOIN inturn_order_expectation e ON e.id = w.record_key::bigint
 WHERE w.state = 'pending' AND w.queue = 'orders' AND w.reason = 'unanswered-order'
   AND w.record_kind = 'order'
   AND (e.id IS NULL OR e.answered_at IS NOT NULL)
 ORDER BY w.id
 LIMIT %(limit)s;

-- name: pending_count
SELECT count(*) AS n FROM inturn_worklist_item
 WHERE state = 'pending' AND queue = 'orders' AND reason = 'unanswered-order';
