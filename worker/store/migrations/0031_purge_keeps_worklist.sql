-- Purge removes nothing a person still has to act on. A finished delivery row is kept, whatever
-- its age, while a pending worklist item names it (record kind 'delivery': a given-up message on
-- delivery-failed, resent or not -- the resent-delivered rule follows the chain of copies from
-- it -- or an expired, skipped one), and while its order expectation is unanswered and either
-- not yet due or pending on the orders worklist (an expectation the sweeper never raises, its
-- orders pack not run, keeps nothing past its due time). Before 0031 a failed message went
-- with its age and its delivery-failed item stayed pending with nothing left to resend.
--
-- The rule is written once (the text `keep` below) and composed into the deleting function and
-- into the counting ones that `inturn purge --dry-run` calls; the worklist's and the leases'
-- counts use the same predicates as their deleting functions (0011, 0030). All SECURITY
-- DEFINER, granted to the purge role only (store/roles.py FUNCTIONS); the search_path names
-- the schema being migrated.
DO $migration$
DECLARE
    keep text := $k$
        NOT EXISTS (SELECT 1 FROM inturn_worklist_item w
                     WHERE w.state = 'pending' AND w.record_kind = 'delivery'
                       AND w.record_key = d.id::text)
        AND NOT EXISTS (SELECT 1 FROM inturn_order_expectation e
                         WHERE e.delivery_id = d.id AND e.answered_at IS NULL
                           AND (e.due_at > now()
                                OR EXISTS (SELECT 1 FROM inturn_worklist_item o
                                            WHERE o.state = 'pending' AND o.record_kind = 'order'
                                              AND o.record_key = e.id::text)))
    $k$;
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION inturn_purge_deliveries(purge_state text, cutoff timestamptz,
                                                           batch integer) RETURNS SETOF bigint
            LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = %I, pg_temp
            AS $body$
                DELETE FROM inturn_delivery
                 WHERE id IN (
                       SELECT d.id FROM inturn_delivery d
                        WHERE d.state = purge_state AND d.state <> 'pending'
                          AND d.finished_at < cutoff AND %s
                        ORDER BY d.finished_at
                        LIMIT least(batch, 5000))
                RETURNING id
            $body$
    $f$, current_schema(), keep);
    EXECUTE format($f$
        CREATE FUNCTION inturn_purge_deliveries_count(purge_state text, cutoff timestamptz)
            RETURNS bigint
            LANGUAGE sql STABLE SECURITY DEFINER SET search_path = %I, pg_temp
            AS $body$
                SELECT count(*) FROM inturn_delivery d
                 WHERE d.state = purge_state AND d.state <> 'pending'
                   AND d.finished_at < cutoff AND %s
            $body$
    $f$, current_schema(), keep);
    EXECUTE format($f$
        CREATE FUNCTION inturn_purge_worklist_count(older_than_seconds float8) RETURNS bigint
            LANGUAGE sql STABLE SECURITY DEFINER SET search_path = %I, pg_temp
            AS $body$
                SELECT count(*) FROM inturn_worklist_item
                 WHERE state = 'cleared'
                   AND cleared_at < now() - make_interval(secs => older_than_seconds)
            $body$
    $f$, current_schema());
    EXECUTE format($f$
        CREATE FUNCTION inturn_purge_leases_count(expired_seconds float8) RETURNS bigint
            LANGUAGE sql STABLE SECURITY DEFINER SET search_path = %I, pg_temp
            AS $body$
                SELECT count(*) FROM inturn_lease l
                 WHERE position(':' in l.destination) = 0
                   AND l.expires_at < clock_timestamp() - make_interval(secs => expired_seconds)
                   AND NOT EXISTS (SELECT 1 FROM inturn_destination r
                                    WHERE r.destination = l.destination
                                      AND r.deleted_at IS NULL)
            $body$
    $f$, current_schema());
END
$migration$;

REVOKE EXECUTE ON FUNCTION
    inturn_purge_deliveries_count(text, timestamptz), inturn_purge_worklist_count(float8),
    inturn_purge_leases_count(float8)
  FROM PUBLIC;

-- The kept-row checks use indexes of their own: a worklist item by the record it names (0005's
-- inturn_worklist_record), the expectations of a delivery (0014's inturn_order_expectation_delivery).
