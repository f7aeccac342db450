-- Hardening (issue 27): a bound on what a peer creates held where it is stored, and a sweeper
-- that can enqueue only the cancellation notice a booking record makes.

-- 1. Feed senders (MSH-3.1^MSH-4.1 of a per-sender feed) are bounded per channel in the table
--    itself, so that restarts and several ingest replicas cannot multiply the bound. The bound is
--    ingest's --max-feed-senders, written with the declaration. A sender is noise until seen
--    twice (messages > 1): the sweeper never raises one, and a newcomer over the bound takes the
--    place of the longest-quiet noise sender, never of a sender seen more than once.
ALTER TABLE inturn_feed
    ADD COLUMN max_senders integer NOT NULL DEFAULT 100 CHECK (max_senders >= 0);
ALTER TABLE inturn_feed_sender
    ADD COLUMN messages bigint NOT NULL DEFAULT 1 CHECK (messages >= 1);
-- Before this release the count was not kept: a sender heard at two different times is real.
UPDATE inturn_feed_sender SET messages = 2 WHERE first_message_at < last_message_at;

DO $migration$
BEGIN
    -- Runs for each new (channel, sender) row, as its owner (ingest may not delete). It locks
    -- the feed's row, so that inserts of every ingest replica into one channel take turns, and
    -- counts with a snapshot taken after the lock (a plpgsql statement's own), so no two of
    -- them can both take the last place. Returns NULL (the row is not inserted) over the bound.
    EXECUTE format($f$
        CREATE FUNCTION inturn_feed_sender_admit() RETURNS trigger
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %I, pg_temp
            AS $body$
            DECLARE
                room integer;
                held bigint;
            BEGIN
                IF EXISTS (SELECT 1 FROM inturn_feed_sender
                            WHERE channel = NEW.channel AND sender = NEW.sender) THEN
                    RETURN NEW;  -- known: ON CONFLICT updates it
                END IF;
                SELECT max_senders INTO room FROM inturn_feed
                 WHERE channel = NEW.channel FOR UPDATE;
                IF NOT FOUND THEN
                    RETURN NEW;  -- the foreign key refuses it
                END IF;
                IF EXISTS (SELECT 1 FROM inturn_feed_sender
                            WHERE channel = NEW.channel AND sender = NEW.sender) THEN
                    RETURN NEW;  -- another replica added it while we waited
                END IF;
                SELECT count(*) INTO held FROM inturn_feed_sender WHERE channel = NEW.channel;
                IF held < room THEN
                    RETURN NEW;
                END IF;
                DELETE FROM inturn_feed_sender
                 WHERE (channel, sender) IN (
                       SELECT channel, sender FROM inturn_feed_sender
                        WHERE channel = NEW.channel AND messages = 1
                        ORDER BY last_message_at, sender
                        LIMIT 1);
                IF FOUND THEN
                    RETURN NEW;  -- took the place of a sender seen once
                END IF;
                RETURN NULL;
            END
            $body$
    $f$, current_schema());

    -- 2. The one way the sweeper writes a delivery: the cancellation notice of a cancelled
    --    booking to a carrier, built here from the booking record (the same bytes as
    --    inturn.worker.reservations.notice.build_notice), enqueued on the live Destination that
    --    serves the carrier. The sweeper passes names, never a payload; every value put into the
    --    message must be ASCII letters, digits or '-' (what an import accepts), so a record
    --    changed through the sweeper's own UPDATE privilege cannot carry another segment.
    --    Returns the delivery id and its destination (the caller wakes its worker); a notice
    --    already enqueued for the booking and carrier is returned, not made twice.
    EXECUTE format($f$
        CREATE FUNCTION inturn_enqueue_cancel_notice(notice_locator text, notice_carrier text)
            RETURNS TABLE (id bigint, destination text)
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %I, pg_temp
            AS $body$
            DECLARE
                b inturn_booking%%ROWTYPE;
                target_destination text;
                target_channel text;
                segments text;
                bad bigint;
                stamp text;
                control text;
                body text;
                found_id bigint;
            BEGIN
                SELECT * INTO b FROM inturn_booking k WHERE k.locator = notice_locator
                   FOR UPDATE;  -- two calls for one booking take turns: one notice
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'no booking %%', notice_locator USING ERRCODE = 'P0002';
                END IF;
                IF b.cancelled_at IS NULL THEN
                    RAISE EXCEPTION 'booking %% is not cancelled', notice_locator
                        USING ERRCODE = '55000';
                END IF;
                SELECT d.destination, d.channel INTO target_destination, target_channel
                  FROM inturn_destination_carrier c
                  JOIN inturn_destination d
                    ON d.destination = c.destination AND d.deleted_at IS NULL
                 WHERE c.carrier = notice_carrier;
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'no Destination serves carrier %%', notice_carrier
                        USING ERRCODE = 'P0002';
                END IF;
                WITH mine AS (
                    SELECT s.number, s.carrier, s.flight, s.date, s.origin, s.destination,
                           e.previous
                      FROM inturn_segment s
                      JOIN LATERAL (
                           SELECT ev.previous, ev.outcome FROM inturn_segment_event ev
                            WHERE ev.locator = s.locator AND ev.number = s.number
                            ORDER BY ev.id DESC LIMIT 1) e ON e.outcome = 'withdrawn'
                     WHERE s.locator = notice_locator AND s.carrier = notice_carrier
                       AND s.status = 'XX'
                )
                SELECT string_agg(
                           format(E'ZSG|%%s|%%s|%%s|%%s|%%s|%%s|XX|%%s\r', m.number, m.carrier,
                                  m.flight, to_char(m.date, 'YYYYMMDD'), m.origin,
                                  m.destination, m.previous),
                           '' ORDER BY m.number),
                       count(*) FILTER (WHERE NOT (
                           m.carrier ~ '^[A-Za-z0-9-]+$' AND m.flight ~ '^[A-Za-z0-9-]+$'
                           AND m.origin ~ '^[A-Za-z0-9-]+$'
                           AND m.destination ~ '^[A-Za-z0-9-]+$'
                           AND coalesce(m.previous, '') ~ '^[A-Za-z0-9-]+$'))
                  INTO segments, bad
                  FROM mine m;
                IF segments IS NULL THEN
                    RAISE EXCEPTION 'booking %% has no withdrawn segment of %%', notice_locator,
                        notice_carrier USING ERRCODE = '55000';
                END IF;
                IF bad > 0 OR NOT (notice_locator ~ '^[A-Za-z0-9-]+$'
                                   AND notice_carrier ~ '^[A-Za-z0-9-]+$'
                                   AND b.owner ~ '^[A-Za-z0-9-]+$'
                                   AND b.cancel_reason ~ '^[A-Za-z0-9-]+$') THEN
                    RAISE EXCEPTION 'booking %% holds a value a notice cannot carry',
                        notice_locator USING ERRCODE = '22023';
                END IF;
                control := 'XX' || notice_locator || notice_carrier;
                SELECT x.id INTO found_id FROM inturn_delivery x
                 WHERE x.destination = target_destination AND x.control_id = control
                   AND x.message_type = 'ZRC^Z01'
                 ORDER BY x.id LIMIT 1;
                IF FOUND THEN
                    RETURN QUERY SELECT found_id, target_destination;
                    RETURN;
                END IF;
                stamp := to_char(b.cancelled_at AT TIME ZONE 'UTC', 'YYYYMMDDHH24MISS');
                body := format(E'MSH|^~\\&|INTURN|%%s|%%s|%%s|%%s||ZRC^Z01^ZRC_Z01|%%s|P|2.5\r',
                               b.owner, notice_carrier, notice_carrier, stamp, control)
                        || format(E'ZRB|%%s|%%s|%%s|%%s\r', notice_locator, b.owner,
                                  b.cancel_reason, stamp)
                        || segments;
                PERFORM inturn_enqueue_lock(target_destination);
                RETURN QUERY
                    INSERT INTO inturn_delivery AS x
                           (destination, channel, control_id, message_type, payload, size,
                            patient_keys)
                    VALUES (target_destination, target_channel, control, 'ZRC^Z01',
                            convert_to(body, 'UTF8'), octet_length(body), '{}')
                    RETURNING x.id, x.destination;
            END
            $body$
    $f$, current_schema());
END
$migration$;

CREATE TRIGGER inturn_feed_sender_admit BEFORE INSERT ON inturn_feed_sender
    FOR EACH ROW EXECUTE FUNCTION inturn_feed_sender_admit();

REVOKE EXECUTE ON FUNCTION inturn_feed_sender_admit(), inturn_enqueue_cancel_notice(text, text)
    FROM PUBLIC;

-- 3. An order key is matched under its owner now (issue 27, item 1): the destination and the
--    peer the order was addressed to, MSH-5^MSH-6 first components (inturn.worker.spec.replies.
--    owner_scope). Open expectations recorded before this release get their digest under that
--    owner from their order's MSH segment, so the replies they wait for still answer them: the
--    bytes hashed are those of key_digest(owner_scope(destination, peer), key). Orders whose
--    row is gone, or is not plain HL7 (no MSH, a NUL byte), keep the old digest: no reply
--    answers them any more, and the sweeper raises them when due, as a missing reply.
WITH head AS (
    SELECT e.id, e.destination, e.order_key,
           split_part(convert_from(substring(d.payload FROM 1 FOR 4096), 'LATIN1'),
                      E'\r', 1) AS seg
      FROM inturn_order_expectation e
      JOIN inturn_delivery d ON d.id = e.delivery_id
     WHERE e.answered_at IS NULL
       AND substring(d.payload FROM 1 FOR 3) = '\x4d5348'::bytea
       AND position('\x00'::bytea IN substring(d.payload FROM 1 FOR 4096)) = 0
),
parts AS (
    SELECT h.id, h.destination, h.order_key,
           split_part(split_part(h.seg, substr(h.seg, 4, 1), 5), substr(h.seg, 5, 1), 1) AS app,
           split_part(split_part(h.seg, substr(h.seg, 4, 1), 6), substr(h.seg, 5, 1), 1) AS fac
      FROM head h
     WHERE length(h.seg) >= 8
)
UPDATE inturn_order_expectation e
   SET key_digest = left(encode(sha256(
           convert_to(p.destination, 'UTF8') || '\x00'::bytea
           || convert_to(btrim(p.app, E' \t\n\r\f' || chr(11)) || '^'
                         || btrim(p.fac, E' \t\n\r\f' || chr(11)), 'UTF8')
           || '\x00'::bytea
           || convert_to(btrim(p.order_key, E' \t\n\r\f' || chr(11)), 'UTF8')), 'hex'), 32)
  FROM parts p
 WHERE e.id = p.id;
