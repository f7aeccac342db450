-- A destination's lease names its holder's backend on a direct connection (issue 29, the
-- killed worker's fast takeover): acquire records backend_pid (the column of 0019) when the
-- holder's own session holds the destination's worker session lock (inturn_worker_lock), and
-- NULL behind a pooler (no stable backend). A taker may then take the lease over at once, its
-- epoch raised as on any takeover, when that backend no longer holds the lock: the holder's
-- session ended (killed, crashed; the kernel closed its socket). Epoch fencing is unchanged, so
-- safety does not rest on this check; behind a pooler the lease's expiry stays the only rule.
--
-- inturn_worker_lock_holder: the pid of the backend holding a destination's worker session lock,
-- or NULL. pg_locks shows every session's advisory locks; the function reads it under a fixed
-- search_path, granted to the worker only (as the lock functions of 0011 are).
CREATE FUNCTION inturn_worker_lock_holder(destination text) RETURNS integer
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    AS $$
        SELECT min(l.pid)
          FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND ((l.classid::int8 << 32) | l.objid::int8)
               = hashtextextended('inturn:worker:' || destination, 0)
    $$;

REVOKE EXECUTE ON FUNCTION inturn_worker_lock_holder(text) FROM PUBLIC;
