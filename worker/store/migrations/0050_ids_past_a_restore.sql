-- Ids are never handed out twice across a restore (issue 39, noticed after it): a restore takes
-- the id sequences back with the rows, so the messages accepted after it were given the ids the
-- lost messages had, and an id in an audit record, a worklist item or a person's
-- `mark-delivered --through` could name two messages. When a restore is found (the operator's
-- witness, inturn local's witness file), inturn_ids_past moves the delivery rows' and the
-- channel log's sequences past the largest ids the witness saw, so every message accepted from
-- then on has an id no message had before the restore. Only forward: a sequence already past
-- the bound is left as it is. It runs as its owner (the roles that find restores hold no
-- privilege on the sequences) and is executable by the operator and admin only.
-- Online: a new function, nothing else changed.
DO $migration$
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION inturn_ids_past(delivery_id bigint, message_id bigint)
            RETURNS void
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %1$I, pg_temp
            AS $body$
            BEGIN
                -- nextval is atomic: a value below the bound means the sequence is behind it,
                -- and setval puts it at the bound (the next value drawn is one past it)
                IF delivery_id IS NOT NULL
                   AND nextval('inturn_delivery_id_seq') < delivery_id THEN
                    PERFORM setval('inturn_delivery_id_seq', delivery_id);
                END IF;
                IF message_id IS NOT NULL
                   AND nextval('inturn_message_id_seq') < message_id THEN
                    PERFORM setval('inturn_message_id_seq', message_id);
                END IF;
            END
            $body$
    $f$, current_schema());
END
$migration$;

REVOKE EXECUTE ON FUNCTION inturn_ids_past(bigint, bigint) FROM PUBLIC;
