-- Named queries of inturn.worker.store.restore: the database's clock and what each destination
-- has accepted and delivered (issue 39, part 1).

-- name: tick
-- Move the clock on; the tick it held before and the one it holds now (its row made again if
-- someone emptied the table: then it held 0).
INSERT INTO inturn_clock AS c (one, tick, at) VALUES (true, 1, now())
ON CONFLICT (one) DO UPDATE SET tick = c.tick + 1, at = now()
RETURNING tick - 1 AS before, tick AS now;

-- name: clock
SELECT tick FROM inturn_clock WHERE one;

-- name: witness
-- Per live destination: its last delivered row (hot table or history) and its last row.
SELECT r.destination, dl.id AS delivered_through, dl.finished_at AS delivered_at,
       ac.id AS accepted_through, ac.enqueued_at AS accepted_at
  FROM inturn_destination r
  LEFT JOIN LATERAL (
      SELECT x.id, x.finished_at
        FROM ((SELECT d.id, d.finished_at FROM inturn_delivery d
                WHERE d.destination = r.destination AND d.state = 'delivered'
                ORDER BY d.id DESC LIMIT 1)
              UNION ALL
              (SELECT h.id, h.finished_at FROM inturn_history h
                WHERE h.destination = r.destination AND h.state = 'delivered'
                ORDER BY h.id DESC LIMIT 1)) AS x
       ORDER BY x.id DESC LIMIT 1) AS dl ON true
  LEFT JOIN LATERAL (
      SELECT x.id, x.enqueued_at
        FROM ((SELECT d.id, d.enqueued_at FROM inturn_delivery d
                WHERE d.destination = r.destination ORDER BY d.id DESC LIMIT 1)
              UNION ALL
              (SELECT h.id, h.enqueued_at FROM inturn_history h
                WHERE h.destination = r.destination ORDER BY h.id DESC LIMIT 1)) AS x
       ORDER BY x.id DESC LIMIT 1) AS ac ON true
 WHERE r.deleted_at IS NULL;

-- name: exposure
-- Pending rows of a destination up to an id: delivered before the database went back, queued
-- again by the restore (they would be sent twice).
SELECT count(*) AS again
  FROM inturn_delivery
 WHERE destination = %(destination)s AND state = 'pending' AND id <= %(through)s;

-- name: mark_delivered
-- A person's decision after a restore: the pending rows of a destination up to an id were
-- delivered before (the receiver has them); they are marked so, never sent again.
UPDATE inturn_delivery
   SET state = 'delivered', finished_at = clock_timestamp(), decided_by = %(who)s,
       reason = 'marked delivered: delivered before the database was restored'
 WHERE destination = %(destination)s AND state = 'pending' AND id <= %(through)s
RETURNING id;
