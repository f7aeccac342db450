-- The destination registry (table inturn_destination): written by the operator (or `inturn
-- local`), read by ingest for routing. Also the operator's one grouped status query.

-- name: register
-- Upsert one destination; a row marked deleted comes back to life. Only a real change writes.
INSERT INTO inturn_destination
       (destination, namespace, name, channel, message_types, generation, suspended,
        sender_kind, sender, stuck_after_seconds, expire_after_seconds, schedule, replies,
        filter_fields, lanes, pack_spec, profile)
VALUES (%(destination)s, %(namespace)s, %(name)s, %(channel)s, %(message_types)s,
        %(generation)s, %(suspended)s, %(sender_kind)s, %(sender)s, %(stuck_after_seconds)s,
        %(expire_after_seconds)s, %(schedule)s::jsonb, %(replies)s::jsonb,
        %(filter_fields)s::jsonb, %(lanes)s, %(pack_spec)s::jsonb, %(profile)s::jsonb)
ON CONFLICT (destination) DO UPDATE
   SET namespace = EXCLUDED.namespace,
       name = EXCLUDED.name,
       channel = EXCLUDED.channel,
       message_types = EXCLUDED.message_types,
       generation = EXCLUDED.generation,
       suspended = EXCLUDED.suspended,
       sender_kind = EXCLUDED.sender_kind,
       sender = EXCLUDED.sender,
       stuck_after_seconds = EXCLUDED.stuck_after_seconds,
       expire_after_seconds = EXCLUDED.expire_after_seconds,
       schedule = EXCLUDED.schedule,
       replies = EXCLUDED.replies,
       filter_fields = EXCLUDED.filter_fields,
       lanes = EXCLUDED.lanes,
       pack_spec = EXCLUDED.pack_spec,
       profile = EXCLUDED.profile,
       updated_at = now(),
       deleted_at = NULL
 WHERE inturn_destination.deleted_at IS NOT NULL
    OR (inturn_destination.namespace, inturn_destination.name, inturn_destination.channel,
        inturn_destination.message_types, inturn_destination.generation,
        inturn_destination.suspended, inturn_destination.sender_kind, inturn_destination.sender,
        inturn_destination.stuck_after_seconds, inturn_destination.expire_after_seconds,
        inturn_destination.schedule, inturn_destination.replies,
        inturn_destination.filter_fields, inturn_destination.lanes, inturn_destination.pack_spec,
        inturn_destination.profile)
       IS DISTINCT FROM
       (EXCLUDED.namespace, EXCLUDED.name, EXCLUDED.channel, EXCLUDED.message_types,
        EXCLUDED.generation, EXCLUDED.suspended, EXCLUDED.sender_kind, EXCLUDED.sender,
        EXCLUDED.stuck_after_seconds, EXCLUDED.expire_after_seconds, EXCLUDED.schedule,
        EXCLUDED.replies, EXCLUDED.filter_fields, EXCLUDED.lanes, EXCLUDED.pack_spec,
        EXCLUDED.profile)
RETURNING destination;

-- name: mark_deleted
-- The Destination is gone: stop routing to it. Its queued messages stay where they are; the
-- carriers it served are released.
WITH released AS (
    DELETE FROM inturn_destination_carrier WHERE destination = %(destination)s
)
UPDATE inturn_destination
   SET deleted_at = now(), updated_at = now()
 WHERE destination = %(destination)s AND deleted_at IS NULL
RETURNING destination;

-- name: release_carriers
-- Release the carriers a destination holds that are not in the given list.
DELETE FROM inturn_destination_carrier
 WHERE destination = %(destination)s AND NOT (carrier = ANY (%(carriers)s::text[]))
RETURNING carrier;

-- name: claim_carriers
-- Claim the given carriers that nobody holds. A carrier held by another destination is left
-- alone (see carrier_holders).
INSERT INTO inturn_destination_carrier (carrier, destination)
SELECT c, %(destination)s FROM unnest(%(carriers)s::text[]) AS c
ON CONFLICT (carrier) DO NOTHING
RETURNING carrier;

-- name: carrier_holders
-- Which other destinations hold any of the given carriers.
SELECT carrier, destination
  FROM inturn_destination_carrier
 WHERE carrier = ANY (%(carriers)s::text[]) AND destination <> %(destination)s
 ORDER BY carrier;

-- name: active_for_channel
SELECT destination, namespace, name, channel, message_types, generation, suspended, sender_kind,
       deleted_at IS NOT NULL AS deleted,
       ARRAY(SELECT carrier FROM inturn_destination_carrier c
              WHERE c.destination = inturn_destination.destination ORDER BY carrier)
           AS carriers,
       sender, stuck_after_seconds, expire_after_seconds, schedule, replies, filter_fields,
       lanes, pack_spec, profile
  FROM inturn_destination
 WHERE channel = %(channel)s AND deleted_at IS NULL
 ORDER BY destination;

-- name: list_all
SELECT destination, namespace, name, channel, message_types, generation, suspended, sender_kind,
       deleted_at IS NOT NULL AS deleted,
       ARRAY(SELECT carrier FROM inturn_destination_carrier c
              WHERE c.destination = inturn_destination.destination ORDER BY carrier)
           AS carriers,
       sender, stuck_after_seconds, expire_after_seconds, schedule, replies, filter_fields,
       lanes, pack_spec, profile
  FROM inturn_destination
 ORDER BY destination;

-- name: status_depth
-- One grouped query for every destination with something pending or failed, plus its head's
-- attempts and last error (the head is the pending row with the smallest id). Pending counts
-- the channel log's messages routed to it and not pulled yet (migration 0038) beside its rows.
WITH d AS (
    SELECT destination,
           count(*) FILTER (WHERE state = 'pending') AS pending,
           count(*) FILTER (WHERE state = 'failed' AND resent_as IS NULL) AS failed,
           min(enqueued_at) FILTER (WHERE state = 'pending') AS oldest,
           coalesce(max(attempts) FILTER (WHERE state = 'pending'), 0) AS max_attempts,
           min(id) FILTER (WHERE state = 'pending') AS head_id
      FROM inturn_delivery
     WHERE state IN ('pending', 'failed')
     GROUP BY destination
),
u AS (
    SELECT destination, pending, oldest FROM inturn_unpulled(NULL)
)
SELECT coalesce(d.destination, u.destination) AS destination,
       coalesce(d.pending, 0) + coalesce(u.pending, 0) AS pending,
       coalesce(d.failed, 0) AS failed, least(d.oldest, u.oldest) AS oldest,
       coalesce(d.max_attempts, 0) AS max_attempts,
       coalesce(h.attempts, 0) AS head_attempts, h.last_error AS head_error,
       coalesce(r.lanes, 1) AS lanes
  FROM d
  FULL JOIN u ON u.destination = d.destination
  LEFT JOIN inturn_delivery h ON h.id = d.head_id
  LEFT JOIN inturn_destination r
         ON r.destination = coalesce(d.destination, u.destination) AND r.deleted_at IS NULL;

-- name: hold
-- Suspend delivery from the console or the CLI (see migration 0008). Returns the row when the
-- destination is registered; an existing hold keeps its first author and time.
UPDATE inturn_destination
   SET held_at = coalesce(held_at, now()),
       held_by = coalesce(held_by, %(who)s),
       held_why = coalesce(held_why, %(why)s),
       updated_at = now()
 WHERE destination = %(destination)s
RETURNING destination, held_at;

-- name: release
UPDATE inturn_destination
   SET held_at = NULL, held_by = NULL, held_why = NULL, updated_at = now()
 WHERE destination = %(destination)s
RETURNING destination;

-- name: overview
-- Every registered destination with its hold and sender, for the console's overview.
SELECT destination, channel, sender, suspended, held_at, held_by, held_why,
       deleted_at IS NOT NULL AS deleted, stuck_after_seconds, lanes
  FROM inturn_destination
 ORDER BY destination;

-- name: hold_state
-- A destination's holds before a suspend or resume changes them (locked until the caller's
-- transaction ends): the person's hold (held_at/held_by) and the manifest's spec.suspend.
SELECT held_at, held_by, suspended FROM inturn_destination
 WHERE destination = %(destination)s
   FOR UPDATE;

-- name: held
-- Whether a destination's delivery is held (suspend from the console or the CLI, or the
-- operator's hold after a restore).
SELECT held_at IS NOT NULL AS held FROM inturn_destination WHERE destination = %(destination)s;
