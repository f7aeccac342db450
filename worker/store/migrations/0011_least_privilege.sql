-- Locks only the component that owns them can take, and deletions only purge's rules allow.
--
-- Each function runs as its owner (the role that migrates, which owns the tables) with a fixed
-- search_path, so a caller's own schemas or temporary objects cannot stand in for ours; who may
-- call which is granted by `inturn migrate --create-roles` (inturn.worker.store.roles.FUNCTIONS),
-- and nobody else may (EXECUTE is revoked from PUBLIC here).
--
-- The advisory lock keys are the texts hashed into the bigint key since migration 0001
-- ("inturn:worker:<destination>", "inturn:enqueue:<destination>", "inturn:purge",
-- "inturn:sweep"), so a process of the previous release and one of this release exclude each
-- other during a rolling upgrade. Taking the locks directly (pg_advisory_lock and its
-- relatives) is refused to the component roles once a superuser has run --create-roles, which
-- revokes those functions from PUBLIC: see the README's "Security model".

-- The worker lock of a destination (session lock, try only): only its holder sends.
CREATE FUNCTION inturn_worker_lock(destination text) RETURNS boolean
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    AS $$ SELECT pg_try_advisory_lock(hashtextextended('inturn:worker:' || destination, 0)) $$;

CREATE FUNCTION inturn_worker_unlock(destination text) RETURNS boolean
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    AS $$ SELECT pg_advisory_unlock(hashtextextended('inturn:worker:' || destination, 0)) $$;

-- The enqueue lock of a destination (transaction lock): enqueues commit in id order. Returns
-- true once held (a value that count() counts, unlike void).
CREATE FUNCTION inturn_enqueue_lock(destination text) RETURNS boolean
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    AS $$
        SELECT pg_advisory_xact_lock(hashtextextended('inturn:enqueue:' || destination, 0));
        SELECT true;
    $$;

-- The purge and sweep singletons (session locks, try only).
CREATE FUNCTION inturn_purge_lock() RETURNS boolean
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    AS $$ SELECT pg_try_advisory_lock(hashtextextended('inturn:purge', 0)) $$;

CREATE FUNCTION inturn_purge_unlock() RETURNS boolean
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    AS $$ SELECT pg_advisory_unlock(hashtextextended('inturn:purge', 0)) $$;

CREATE FUNCTION inturn_sweep_lock() RETURNS boolean
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    AS $$ SELECT pg_try_advisory_lock(hashtextextended('inturn:sweep', 0)) $$;

CREATE FUNCTION inturn_sweep_unlock() RETURNS boolean
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    AS $$ SELECT pg_advisory_unlock(hashtextextended('inturn:sweep', 0)) $$;

-- What purge deletes, and nothing else: finished deliveries (never a pending one) and cleared
-- worklist items, a batch of at most 5,000 at a time, oldest first. The purge role has no DELETE
-- privilege of its own. The search_path names the schema being migrated.
DO $migration$
BEGIN
    EXECUTE format($f$
        CREATE FUNCTION inturn_purge_deliveries(purge_state text, cutoff timestamptz,
                                                batch integer) RETURNS SETOF bigint
            LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = %I, pg_temp
            AS $body$
                DELETE FROM inturn_delivery
                 WHERE id IN (
                       SELECT id FROM inturn_delivery
                        WHERE state = purge_state AND state <> 'pending'
                          AND finished_at < cutoff
                        ORDER BY finished_at
                        LIMIT least(batch, 5000))
                RETURNING id
            $body$
    $f$, current_schema());
    EXECUTE format($f$
        CREATE FUNCTION inturn_purge_worklist(older_than_seconds float8, batch integer)
            RETURNS SETOF bigint
            LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = %I, pg_temp
            AS $body$
                DELETE FROM inturn_worklist_item
                 WHERE id IN (
                       SELECT id FROM inturn_worklist_item
                        WHERE state = 'cleared'
                          AND cleared_at < now() - make_interval(secs => older_than_seconds)
                        ORDER BY cleared_at
                        LIMIT least(batch, 5000))
                RETURNING id
            $body$
    $f$, current_schema());
END
$migration$;

REVOKE EXECUTE ON FUNCTION
    inturn_worker_lock(text), inturn_worker_unlock(text), inturn_enqueue_lock(text),
    inturn_purge_lock(), inturn_purge_unlock(), inturn_sweep_lock(), inturn_sweep_unlock(),
    inturn_purge_deliveries(text, timestamptz, integer), inturn_purge_worklist(float8, integer)
  FROM PUBLIC;
