-- MSH-10 in history by an index whose inserts gather (issue 37; docs/explanation/storage-layout.md,
-- "What history does cost a drain"). The maintenance's move writes each finished row into the
-- open day's history partition, and its hash index on control_id took each row at a random
-- bucket page: after a checkpoint nearly every row moved wrote a whole page to the WAL (3.6 MB
-- of full-page images to move 1,000 rows into a partition of 550,000, 3.9 KB of WAL a row).
-- History partitions made from now on index MSH-10 with a GIN over ARRAY[left(control_id, 200)]
-- with fastupdate (its first 200 characters: a GIN key has a size limit, and a long control ID
-- must never make the move fail, as migration 0004 chose the hash index for; ingest bounds
-- MSH-10 at 199 characters, so the key is the whole MSH-10 of every message it accepts): a row moved is appended to the index's pending list (about 250 bytes of WAL, no
-- full-page image), and the list is merged into the tree in one pass when it reaches
-- gin_pending_list_limit or when (auto)vacuum visits the partition (about 230 bytes a row
-- more, right after a checkpoint, for 61,000 rows of random MSH-10s). A lookup also reads the
-- pending list: a few ms more on the open day at its longest, 0.06 ms on a merged day.
-- Readers of history by MSH-10 ask both `control_id = $1` and
-- `ARRAY[left(control_id, 200)] @> ARRAY[left($1, 200)]`, so each partition is read through the
-- index it has.
--
-- Partitions that hold rows keep their hash index as it is (as an index of their own, no
-- longer one of the parent's): nothing is rebuilt or rewritten. An empty partition (the next
-- day prepared ahead, a database migrated before its first move) gets the new index.
-- Postgres gives every partition of a partitioned table each of the parent's indexes, so the
-- parent's hash index goes: every partition is detached (its indexes stay on it), the hash
-- index dropped from the parent, the partitions holding rows attached again (the CHECK of
-- their range, which inturn_epoch_prepare gives each partition, spares the scan; epoch 1,
-- made by migration 0034 without one, gets it here: a scan of that partition only when it
-- still holds rows), the GIN made on the parent alone (ON ONLY: no build on partitions that
-- hold rows; each partition attached or created later gets its own), and the empty partitions
-- attached again, each now building its (empty) GIN.
--
-- Online: catalog changes; the detach takes an ACCESS EXCLUSIVE lock on inturn_history for
-- the transaction (milliseconds: lookups and the move wait for it; ingest and delivery do
-- not read history).

DO $migration$
DECLARE
    p record;
    held boolean;
    hash_index text;
    empty_parts text[] := '{}';
    held_parts text[] := '{}';
    spec text;
BEGIN
    LOCK TABLE inturn_history IN ACCESS EXCLUSIVE MODE;
    -- every partition is an epoch's (inturn_history_e<n>): one that is not would lose its
    -- MSH-10 index with the parent's
    IF EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                WHERE i.inhparent = 'inturn_history'::regclass
                  AND NOT EXISTS (SELECT 1 FROM inturn_epoch e
                                   WHERE c.relname = 'inturn_history_e' || e.n)) THEN
        RAISE EXCEPTION 'inturn_history has a partition that is no epoch''s';
    END IF;
    FOR p IN
        SELECT c.relname AS part, e.lo, e.hi
          FROM pg_inherits i
          JOIN pg_class c ON c.oid = i.inhrelid
          JOIN inturn_epoch e ON c.relname = 'inturn_history_e' || e.n
         WHERE i.inhparent = 'inturn_history'::regclass
         ORDER BY e.n
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_constraint
                        WHERE conrelid = p.part::regclass AND conname = p.part || '_range') THEN
            EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I'
                           ' CHECK (message_id >= %s AND message_id < %s)',
                           p.part, p.part || '_range', p.lo, p.hi);
        END IF;
        EXECUTE format('ALTER TABLE inturn_history DETACH PARTITION %I', p.part);
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I)', p.part) INTO STRICT held;
        spec := format('%I FOR VALUES FROM (%s) TO (%s)', p.part, p.lo, p.hi);
        IF held THEN
            held_parts := held_parts || spec;
        ELSE
            empty_parts := empty_parts || spec;
            -- an empty partition's hash index (now its own) goes: it gets the GIN below
            FOR hash_index IN
                SELECT ic.relname
                  FROM pg_index x
                  JOIN pg_class ic ON ic.oid = x.indexrelid
                  JOIN pg_am am ON am.oid = ic.relam
                 WHERE x.indrelid = p.part::regclass AND am.amname = 'hash'
            LOOP
                EXECUTE format('DROP INDEX %I', hash_index);
            END LOOP;
        END IF;
    END LOOP;

    DROP INDEX inturn_history_control_id;

    FOREACH spec IN ARRAY held_parts LOOP
        EXECUTE 'ALTER TABLE inturn_history ATTACH PARTITION ' || spec;
    END LOOP;

    CREATE INDEX inturn_history_msh10 ON ONLY inturn_history
        USING gin ((ARRAY[left(control_id, 200)])) WITH (fastupdate = on);

    FOREACH spec IN ARRAY empty_parts LOOP
        EXECUTE 'ALTER TABLE inturn_history ATTACH PARTITION ' || spec;
    END LOOP;
END
$migration$;
