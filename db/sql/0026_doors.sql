-- The SQL doors into the outbox (migration 0026): enqueue and publish from any driver,
-- any language, any ORM's raw SQL, and triggers, inside the caller's transaction.
--
--   SELECT poller_enqueue(endpoint => 'billing', event_type => 'invoice.paid',
--                         payload => '{"invoice": 42}', idempotency_key => 'invoice:42:paid');
--   SELECT poller_publish(event_type => 'invoice.paid', payload => '{"invoice": 42}',
--                         idempotency_key => 'invoice:42:paid', tenant => 'acme');
--
-- The Python doors (poller.enqueue, poller.publish and their batch and async forms, on
-- every kind of connection) call these same functions: one definition of what a write
-- into the outbox means. Errors carry SQLSTATEs of class WP, one per error class of
-- poller/errors.py (docs/reference/sql.md), a message naming the field, and a DETAIL
-- of JSON with what was refused. Nothing here commits; the NOTIFY that wakes the
-- pollers is delivered only if the caller's transaction commits.
--
-- Settings a caller does not pass come from the database (ALTER DATABASE … SET
-- poller.max_payload_bytes / poller.max_attempts / poller.notify; `poller db upgrade`
-- writes them from POLLER_MAX_PAYLOAD_BYTES, POLLER_MAX_ATTEMPTS and POLLER_NOTIFY),
-- else the defaults: 262144 bytes, 10 attempts, notify on.

-- A setting of the database's (current_setting), else the default.
CREATE FUNCTION poller_setting(p_name text, p_default text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('poller.' || p_name, true), ''), p_default)
$$;

-- Why a message or event cannot be written, checked before anything is: NULL when
-- it can, else {SQLSTATE, message, detail (JSON)}. The same rules as poller/rules/names.py,
-- poller/rules/payloads.py and poller/outbox/insert.py.
CREATE FUNCTION poller_refusal(
    p_event_type text, p_payload text, p_key text, p_ordering_key text,
    p_deliver_at timestamptz, p_deliver_after interval, p_max_attempts integer,
    p_max_payload_bytes integer
) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    doc jsonb;
    size integer;
    why text;
BEGIN
    IF p_event_type IS NULL OR btrim(p_event_type) = '' THEN
        RETURN ARRAY['WP003', 'event_type must be a non-empty string', '{"field": "event_type"}'];
    END IF;
    IF char_length(p_event_type) > 255 THEN
        RETURN ARRAY['WP003', 'event_type is over 255 characters', '{"field": "event_type"}'];
    END IF;
    IF p_event_type !~ '^[A-Za-z0-9][A-Za-z0-9._:/-]*$' THEN
        RETURN ARRAY['WP003', format('event_type %L must be letters, digits and . _ : / - '
            '(starting with a letter or digit), e.g. ''invoice.paid''', left(p_event_type, 80)),
            '{"field": "event_type"}'];
    END IF;
    IF p_key IS NULL OR p_key = '' THEN
        RETURN ARRAY['WP004', 'idempotency_key must not be empty', '{"field": "idempotency_key"}'];
    END IF;
    IF char_length(p_key) > 255 THEN
        RETURN ARRAY['WP004', format('idempotency_key is %s characters; at most 255 are allowed',
            char_length(p_key)), '{"field": "idempotency_key"}'];
    END IF;
    IF p_key !~ '^[!-~]+$' THEN
        RETURN ARRAY['WP004', 'idempotency_key may hold only visible ASCII characters (no '
            'spaces or control characters): it is sent in the webhook-id and Idempotency-Key '
            'headers', '{"field": "idempotency_key"}'];
    END IF;
    IF p_key IN ('.', '..') THEN
        RETURN ARRAY['WP004', format('idempotency_key %L is a path''s dot segment: a lookup URL '
            'holding it would name another resource', p_key), '{"field": "idempotency_key"}'];
    END IF;
    IF p_ordering_key IS NOT NULL THEN
        IF p_ordering_key = '' THEN
            RETURN ARRAY['WP005', 'ordering_key must not be empty', '{"field": "ordering_key"}'];
        END IF;
        IF char_length(p_ordering_key) > 255 THEN
            RETURN ARRAY['WP005', format('ordering_key is %s characters; at most 255 are allowed',
                char_length(p_ordering_key)), '{"field": "ordering_key"}'];
        END IF;
        IF p_ordering_key !~ '^[!-~]+$' THEN
            RETURN ARRAY['WP005', 'ordering_key may hold only visible ASCII characters (no '
                'spaces or control characters): it is sent in the webhook-ordering-key header',
                '{"field": "ordering_key"}'];
        END IF;
    END IF;
    IF p_payload IS NULL THEN
        RETURN ARRAY['WP006', 'payload must be a JSON object, not NULL', '{"field": "payload"}'];
    END IF;
    size := octet_length(p_payload);
    IF size > p_max_payload_bytes THEN
        RETURN ARRAY['WP007', format('payload is %s bytes as UTF-8 JSON; at most %s are allowed '
            '(poller.max_payload_bytes)', size, p_max_payload_bytes),
            json_build_object('field', 'payload', 'size', size,
                              'limit', p_max_payload_bytes)::text];
    END IF;
    IF NOT pg_input_is_valid(p_payload, 'json') THEN
        why := (SELECT message FROM pg_input_error_info(p_payload, 'json'));
        RETURN ARRAY['WP006', 'payload is not JSON: ' || why, '{"field": "payload"}'];
    END IF;
    IF json_typeof(p_payload::json) <> 'object' THEN
        RETURN ARRAY['WP006', format('payload must be a JSON object, not %s',
            json_typeof(p_payload::json)), '{"field": "payload"}'];
    END IF;
    IF NOT pg_input_is_valid(p_payload, 'jsonb') THEN  -- \u0000, a lone surrogate
        why := (SELECT message FROM pg_input_error_info(p_payload, 'jsonb'));
        RETURN ARRAY['WP006', 'payload cannot be stored: ' || why
            || ' (a \u0000 character or a lone surrogate)', '{"field": "payload"}'];
    END IF;
    doc := p_payload::jsonb;
    -- Nested deeper than 127 levels (as deep as serde_json reads by default): a
    -- container at level 127 or deeper. Only a payload with more brackets than
    -- that can.
    IF char_length(p_payload) - char_length(translate(p_payload, '[{', '')) > 127
       AND jsonb_path_exists(doc, '$.**{127 to last} ? (@.type() == "object" || @.type() == "array")')
    THEN
        RETURN ARRAY['WP006', 'payload nests more than 127 levels deep, as deep as serde_json '
            'reads by default: a receiver''s parser may stop there', '{"field": "payload"}'];
    END IF;
    IF jsonb_path_exists(doc, '$.** ? (@.type() == "number" && '
                              '(@ > 1.7976931348623157e308 || @ < -1.7976931348623157e308))') THEN
        RETURN ARRAY['WP006', 'payload holds a number past a double''s range (a receiver reads '
            'it as infinity)', '{"field": "payload"}'];
    END IF;
    IF p_deliver_at IS NOT NULL AND p_deliver_after IS NOT NULL THEN
        RETURN ARRAY['WP000', 'give deliver_at or deliver_after, not both',
            '{"field": "deliver_after"}'];
    END IF;
    IF p_deliver_after IS NOT NULL THEN
        IF p_deliver_after < interval '0' THEN
            RETURN ARRAY['WP000', 'deliver_after must not be negative', '{"field": "deliver_after"}'];
        END IF;
        IF p_deliver_after > interval '100 years' THEN
            RETURN ARRAY['WP000', 'deliver_after must be at most 100 years away',
                '{"field": "deliver_after"}'];
        END IF;
    END IF;
    IF p_deliver_at IS NOT NULL AND (p_deliver_at > now() + interval '100 years'
                                     OR p_deliver_at < now() - interval '100 years') THEN
        RETURN ARRAY['WP000', 'deliver_at must be at most 100 years away, either way',
            '{"field": "deliver_at"}'];
    END IF;
    IF p_max_attempts IS NOT NULL AND (p_max_attempts < 1 OR p_max_attempts > 1000) THEN
        RETURN ARRAY['WP000', format('max_attempts must be from 1 to 1000, not %s', p_max_attempts),
            '{"field": "max_attempts"}'];
    END IF;
    RETURN NULL;
END
$$;

-- A tenant's name, as an endpoint's (poller/endpoints/subscriptions.py): NULL when it may be one.
CREATE FUNCTION poller_tenant_refusal(p_tenant text) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_tenant IS NULL OR p_tenant ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$' THEN NULL
           ELSE ARRAY['WP009', 'tenant must be 1-64 characters of letters, digits, ''.'', ''_'' '
                      'or ''-'', starting with a letter or digit', '{"field": "tenant"}'] END
$$;

-- Raise a refusal (poller_refusal's {SQLSTATE, message, detail}).
CREATE FUNCTION poller_raise(p_refusal text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = p_refusal[1], MESSAGE = p_refusal[2],
                          DETAIL = coalesce(p_refusal[3], '{}');
END
$$;

-- The kernel every write shares (enqueue_many, publish's fan-out, replay): insert
-- these rows — to endpoints the caller checked, no two with one (endpoint, key),
-- budgets resolved — and return their ids in the order given, an existing message's
-- id for an idempotent repeat. Ordered rows are placed behind their keys' heads,
-- under the keys' locks; a reused key with other content, or a spent one, raises
-- (WP011, WP013), and the caller's savepoint or transaction undoes the rest. The
-- NOTIFY per bucket is queued with the rows.
CREATE FUNCTION poller_insert_rows(
    p_endpoint_ids bigint[], p_event_types text[], p_payloads json[], p_keys text[],
    p_max_attempts integer[], p_deliver_ats timestamptz[], p_delays double precision[],
    p_ordering_keys text[], p_event_ids bigint[], p_traceparent text, p_tracestate text,
    p_notify boolean
) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    n integer := cardinality(p_keys);
    statuses text[];
    ids bigint[];
    got jsonb;
    buckets smallint[];
    clash record;
BEGIN
    IF n IS NULL OR n = 0 THEN
        RETURN '{}';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_ordering_keys) AS k WHERE k IS NOT NULL) THEN
        -- Positions are drawn in the order transactions take a key's name (before an
        -- event gets its id, for publish), then its row: created without a head if
        -- missing, each locked until the transaction ends, in key order.
        PERFORM count(pg_advisory_xact_lock(s.lock_id))
        FROM (SELECT DISTINCT hashtextextended(k, 0) AS lock_id
              FROM unnest(p_ordering_keys) AS k WHERE k IS NOT NULL ORDER BY 1 OFFSET 0) AS s;
        WITH locked AS (
            INSERT INTO poller_ordering_keys AS k (endpoint_id, ordering_key)
            SELECT DISTINCT m.endpoint_id, m.ordering_key
            FROM unnest(p_endpoint_ids, p_ordering_keys) AS m(endpoint_id, ordering_key)
            WHERE m.ordering_key IS NOT NULL
            ORDER BY 1, 2
            ON CONFLICT (endpoint_id, ordering_key) DO UPDATE SET head_id = k.head_id
            RETURNING k.endpoint_id, k.ordering_key, k.head_id
        ), placed AS (
            -- The first message of a key with no open one is its head (pending); the
            -- others wait behind it.
            SELECT m.ord, CASE
                WHEN m.ordering_key IS NULL THEN 'pending'
                WHEN l.head_id IS NULL AND row_number() OVER (
                         PARTITION BY m.endpoint_id, m.ordering_key ORDER BY m.ord) = 1
                    THEN 'pending'
                ELSE 'waiting' END AS status
            FROM unnest(p_endpoint_ids, p_ordering_keys) WITH ORDINALITY
                AS m(endpoint_id, ordering_key, ord)
            LEFT JOIN locked l ON l.endpoint_id = m.endpoint_id AND l.ordering_key = m.ordering_key
        )
        SELECT array_agg(status ORDER BY ord) INTO statuses FROM placed;
    END IF;
    WITH m AS (
        SELECT * FROM unnest(p_endpoint_ids, p_event_types, p_payloads, p_keys, p_max_attempts,
                             p_deliver_ats, p_delays, p_ordering_keys, p_event_ids,
                             coalesce(statuses, array_fill('pending'::text, ARRAY[n])))
            WITH ORDINALITY AS m(endpoint_id, event_type, payload, idempotency_key, max_attempts,
                                 deliver_at, delay, ordering_key, event_id, status, ord)
    ), ins AS (
        INSERT INTO poller_outbox
            (endpoint_id, bucket, event_type, payload, idempotency_key, max_attempts,
             next_attempt_at, ordering_key, status, event_id, traceparent, tracestate)
        SELECT m.endpoint_id, e.bucket, m.event_type, m.payload, m.idempotency_key,
               m.max_attempts,
               coalesce(m.deliver_at, now() + make_interval(secs => coalesce(m.delay, 0))),
               m.ordering_key, m.status, m.event_id, p_traceparent, p_tracestate
        FROM m JOIN poller_endpoints e ON e.id = m.endpoint_id
        WHERE NOT EXISTS (SELECT 1 FROM poller_spent_keys k
                          WHERE k.endpoint_id = m.endpoint_id
                            AND k.idempotency_key = m.idempotency_key)
        ORDER BY m.ord
        ON CONFLICT (endpoint_id, idempotency_key) DO NOTHING
        RETURNING poller_outbox.id, poller_outbox.endpoint_id, poller_outbox.idempotency_key,
                  poller_outbox.bucket
    )
    SELECT jsonb_object_agg(ins.endpoint_id || E'\x01' || ins.idempotency_key, ins.id),
           array_agg(DISTINCT ins.bucket)
    INTO got, buckets FROM ins;
    -- (through a jsonb map, not a join: the planner reads an array's unnest as a few rows,
    -- and a nested loop over 10,000 rows both ways took seconds)
    ids := ARRAY(SELECT (got ->> (m.endpoint_id || E'\x01' || m.idempotency_key))::bigint
                 FROM unnest(p_endpoint_ids, p_keys) WITH ORDINALITY AS m(endpoint_id,
                                                                          idempotency_key, ord)
                 ORDER BY m.ord);
    IF statuses IS NOT NULL THEN
        -- A key that had no head: its first message inserted is the head (made pending
        -- if the one meant to be it was an idempotent repeat and not inserted); a key
        -- that got none and has no open message loses its row again.
        WITH heads AS (
            SELECT DISTINCT ON (o.endpoint_id, o.ordering_key) o.id, o.endpoint_id,
                   o.ordering_key, o.status
            FROM poller_outbox o
            JOIN poller_ordering_keys k
              ON k.endpoint_id = o.endpoint_id AND k.ordering_key = o.ordering_key
             AND k.head_id IS NULL
            WHERE o.id = ANY(ids)
            ORDER BY o.endpoint_id, o.ordering_key, o.id
        ), promoted AS (
            UPDATE poller_outbox o SET status = 'pending', updated_at = now()
            FROM heads h WHERE o.id = h.id AND h.status = 'waiting'
        )
        UPDATE poller_ordering_keys k SET head_id = h.id
        FROM heads h
        WHERE k.endpoint_id = h.endpoint_id AND k.ordering_key = h.ordering_key;
        DELETE FROM poller_ordering_keys k
        USING unnest(p_endpoint_ids, p_ordering_keys) AS m(endpoint_id, ordering_key)
        WHERE k.endpoint_id = m.endpoint_id AND k.ordering_key = m.ordering_key
          AND k.head_id IS NULL
          AND NOT EXISTS (SELECT 1 FROM poller_outbox o
                          WHERE o.endpoint_id = k.endpoint_id AND o.ordering_key = k.ordering_key
                            AND o.status IN ('pending', 'waiting', 'in_flight'));
    END IF;
    IF p_notify THEN
        PERFORM pg_notify('poller_outbox', CAST(b AS text)) FROM unnest(buckets) AS b;
    END IF;
    IF array_position(ids, NULL) IS NULL THEN
        RETURN ids;
    END IF;
    -- The rows not inserted: an existing message with the same content (as JSON values,
    -- with the event type and the ordering key) is an idempotent repeat; other content
    -- is a conflict; none at all, a key spent by retention. The first that is not a
    -- repeat raises; the repeats' ids go by their place.
    SELECT m.ord, e.name, m.idempotency_key, o.id INTO clash
    FROM unnest(p_endpoint_ids, p_keys, p_payloads, p_event_types, p_ordering_keys,
                p_event_ids) WITH ORDINALITY
        AS m(endpoint_id, idempotency_key, payload, event_type, ordering_key, event_id, ord)
    JOIN poller_endpoints e ON e.id = m.endpoint_id
    LEFT JOIN poller_outbox o
      ON o.endpoint_id = m.endpoint_id AND o.idempotency_key = m.idempotency_key
    WHERE NOT coalesce(got ? (m.endpoint_id || E'\x01' || m.idempotency_key), false)
      AND NOT coalesce(CAST(o.payload AS jsonb) IS NOT DISTINCT FROM CAST(m.payload AS jsonb)
                       AND o.event_type = m.event_type
                       AND o.ordering_key IS NOT DISTINCT FROM m.ordering_key
                       AND o.event_id IS NOT DISTINCT FROM m.event_id, false)
    ORDER BY m.ord LIMIT 1;
    IF FOUND AND clash.id IS NULL THEN
        PERFORM poller_raise(ARRAY['WP013', format('idempotency key %L was spent on endpoint '
            '%L: its message was purged, and a key is never delivered twice',
            clash.idempotency_key, clash.name),
            json_build_object('endpoint', clash.name,
                              'idempotency_key', clash.idempotency_key)::text]);
    ELSIF FOUND THEN
        PERFORM poller_raise(ARRAY['WP011', format('idempotency key %L of endpoint %L is '
            'taken by message %s with other content', clash.idempotency_key, clash.name,
            clash.id),
            json_build_object('endpoint', clash.name, 'idempotency_key',
                              clash.idempotency_key, 'existing_id', clash.id)::text]);
    END IF;
    SELECT jsonb_object_agg(m.ord::text, o.id) INTO got
    FROM unnest(p_endpoint_ids, p_keys) WITH ORDINALITY AS m(endpoint_id, idempotency_key, ord)
    JOIN poller_outbox o ON o.endpoint_id = m.endpoint_id AND o.idempotency_key = m.idempotency_key
    WHERE NOT coalesce(got ? (m.endpoint_id || E'\x01' || m.idempotency_key), false);
    RETURN ARRAY(SELECT coalesce(i.id, (got ->> i.ord::text)::bigint)
                 FROM unnest(ids) WITH ORDINALITY AS i(id, ord) ORDER BY i.ord);
END
$$;

-- Endpoints by name for a write: their ids and budgets, in the order of p_names; an
-- unknown or disabled one raises (WP001, WP002), the first in that order.
CREATE FUNCTION poller_endpoints_for(p_names text[])
RETURNS TABLE (name text, id bigint, max_attempts integer)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    bad record;
BEGIN
    SELECT w.name, e.id, e.enabled, e.disabled_reason INTO bad
    FROM unnest(p_names) WITH ORDINALITY AS w(name, ord)
    LEFT JOIN poller_endpoints e ON e.name = w.name
    WHERE e.id IS NULL OR NOT e.enabled
    ORDER BY w.ord LIMIT 1;
    IF FOUND AND bad.id IS NULL THEN
        PERFORM poller_raise(ARRAY['WP001', format('unknown endpoint %L', left(bad.name, 80)),
            json_build_object('endpoint', bad.name)::text]);
    ELSIF FOUND THEN
        PERFORM poller_raise(ARRAY['WP002', format('endpoint %L is disabled: %s', bad.name,
            coalesce(bad.disabled_reason, 'disabled')),
            json_build_object('endpoint', bad.name, 'reason', bad.disabled_reason)::text]);
    END IF;
    RETURN QUERY
        SELECT w.name, e.id, e.max_attempts
        FROM unnest(p_names) WITH ORDINALITY AS w(name, ord)
        JOIN poller_endpoints e ON e.name = w.name
        ORDER BY w.ord;
END
$$;

-- One message, written or refused, raising nothing: (id, SQLSTATE, message, detail).
-- What the Python doors call for a single message (a refusal leaves the caller's
-- transaction usable, as an exception in Python does); poller_enqueue raises it.
CREATE FUNCTION poller_try_enqueue(
    p_endpoint text, p_event_type text, p_payload text, p_idempotency_key text,
    p_ordering_key text, p_deliver_at timestamptz, p_deliver_after interval,
    p_max_attempts integer, p_traceparent text, p_tracestate text,
    p_max_payload_bytes integer, p_default_max_attempts integer, p_notify boolean
) RETURNS TABLE (id bigint, sqlstate text, message text, detail text)
LANGUAGE plpgsql AS $$
DECLARE
    refusal text[];
    ep record;
    inserted bigint;
    hit record;
    delay double precision := coalesce(extract(epoch FROM p_deliver_after), 0);
BEGIN
    refusal := poller_refusal(p_event_type, p_payload, p_idempotency_key, p_ordering_key,
        p_deliver_at, p_deliver_after, p_max_attempts,
        coalesce(p_max_payload_bytes, poller_setting('max_payload_bytes', '262144')::integer));
    IF refusal IS NOT NULL THEN
        RETURN QUERY SELECT NULL::bigint, refusal[1], refusal[2], refusal[3];
        RETURN;
    END IF;
    SELECT e.id, e.bucket, e.enabled, e.disabled_reason, e.max_attempts INTO ep
    FROM poller_endpoints e WHERE e.name = p_endpoint;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::bigint, 'WP001', format('unknown endpoint %L', left(p_endpoint, 80)),
            json_build_object('endpoint', p_endpoint)::text;
        RETURN;
    END IF;
    IF NOT ep.enabled THEN
        RETURN QUERY SELECT NULL::bigint, 'WP002', format('endpoint %L is disabled: %s', p_endpoint,
            coalesce(ep.disabled_reason, 'disabled')),
            json_build_object('endpoint', p_endpoint, 'reason', ep.disabled_reason)::text;
        RETURN;
    END IF;
    IF p_ordering_key IS NOT NULL THEN  -- the key's lock and position: the kernel's
        -- a repeat or a conflict is known before anything is written, so the kernel
        -- (which raises) is reached only for a message it will insert or find the same
        SELECT o.id, (CAST(o.payload AS jsonb) = CAST(p_payload AS jsonb)
                      AND o.event_type = p_event_type AND o.ordering_key = p_ordering_key
                      AND o.event_id IS NULL) AS same INTO hit
        FROM poller_outbox o WHERE o.endpoint_id = ep.id AND o.idempotency_key = p_idempotency_key;
        IF FOUND THEN
            IF hit.same THEN
                RETURN QUERY SELECT hit.id, NULL::text, NULL::text, NULL::text;
            ELSE
                RETURN QUERY SELECT NULL::bigint, 'WP011', format('idempotency key %L of endpoint '
                    '%L is taken by message %s with other content', p_idempotency_key,
                    p_endpoint, hit.id), json_build_object('endpoint', p_endpoint,
                    'idempotency_key', p_idempotency_key, 'existing_id', hit.id)::text;
            END IF;
            RETURN;
        END IF;
        IF EXISTS (SELECT 1 FROM poller_spent_keys k WHERE k.endpoint_id = ep.id
                   AND k.idempotency_key = p_idempotency_key) THEN
            RETURN QUERY SELECT NULL::bigint, 'WP013', format('idempotency key %L was spent on '
                'endpoint %L: its message was purged, and a key is never delivered twice',
                p_idempotency_key, p_endpoint), json_build_object('endpoint', p_endpoint,
                'idempotency_key', p_idempotency_key)::text;
            RETURN;
        END IF;
        RETURN QUERY SELECT (poller_insert_rows(ARRAY[ep.id], ARRAY[p_event_type],
            ARRAY[p_payload::json], ARRAY[p_idempotency_key],
            ARRAY[coalesce(p_max_attempts, ep.max_attempts,
                           p_default_max_attempts, poller_setting('max_attempts', '10')::integer)],
            ARRAY[p_deliver_at], ARRAY[delay], ARRAY[p_ordering_key], ARRAY[NULL::bigint],
            p_traceparent, p_tracestate,
            coalesce(p_notify, poller_setting('notify', 'on')::boolean)))[1],
            NULL::text, NULL::text, NULL::text;
        RETURN;
    END IF;
    INSERT INTO poller_outbox
        (endpoint_id, bucket, event_type, payload, idempotency_key, max_attempts,
         next_attempt_at, traceparent, tracestate)
    SELECT ep.id, ep.bucket, p_event_type, p_payload::json, p_idempotency_key,
           coalesce(p_max_attempts, ep.max_attempts, p_default_max_attempts,
                    poller_setting('max_attempts', '10')::integer),
           coalesce(p_deliver_at, now() + make_interval(secs => delay)),
           p_traceparent, p_tracestate
    WHERE NOT EXISTS (SELECT 1 FROM poller_spent_keys k
                      WHERE k.endpoint_id = ep.id AND k.idempotency_key = p_idempotency_key)
    ON CONFLICT (endpoint_id, idempotency_key) DO NOTHING
    RETURNING poller_outbox.id INTO inserted;
    IF inserted IS NOT NULL THEN
        IF coalesce(p_notify, poller_setting('notify', 'on')::boolean) THEN
            PERFORM pg_notify('poller_outbox', CAST(ep.bucket AS text));
        END IF;
        RETURN QUERY SELECT inserted, NULL::text, NULL::text, NULL::text;
        RETURN;
    END IF;
    SELECT o.id, (CAST(o.payload AS jsonb) = CAST(p_payload AS jsonb)
                  AND o.event_type = p_event_type AND o.ordering_key IS NULL
                  AND o.event_id IS NULL) AS same INTO hit
    FROM poller_outbox o WHERE o.endpoint_id = ep.id AND o.idempotency_key = p_idempotency_key;
    IF NOT FOUND THEN  -- purged meanwhile, or long ago
        RETURN QUERY SELECT NULL::bigint, 'WP013', format('idempotency key %L was spent on '
            'endpoint %L: its message was purged, and a key is never delivered twice',
            p_idempotency_key, p_endpoint), json_build_object('endpoint', p_endpoint,
            'idempotency_key', p_idempotency_key)::text;
    ELSIF NOT hit.same THEN
        RETURN QUERY SELECT NULL::bigint, 'WP011', format('idempotency key %L of endpoint %L is '
            'taken by message %s with other content', p_idempotency_key, p_endpoint, hit.id),
            json_build_object('endpoint', p_endpoint, 'idempotency_key', p_idempotency_key,
                              'existing_id', hit.id)::text;
    ELSE
        RETURN QUERY SELECT hit.id, NULL::text, NULL::text, NULL::text;
    END IF;
END
$$;

-- Enqueue one message in the caller's transaction; its id (an idempotent repeat: the
-- first one's). A refusal raises its SQLSTATE (docs/reference/sql.md).
CREATE FUNCTION poller_enqueue(
    endpoint text, event_type text, payload text, idempotency_key text,
    ordering_key text DEFAULT NULL, deliver_at timestamptz DEFAULT NULL,
    deliver_after interval DEFAULT NULL, max_attempts integer DEFAULT NULL,
    traceparent text DEFAULT NULL, tracestate text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM poller_try_enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
                                            NULL, NULL, NULL);
    IF r.sqlstate IS NOT NULL THEN
        PERFORM poller_raise(ARRAY[r.sqlstate, r.message, r.detail]);
    END IF;
    RETURN r.id;
END
$$;

-- The same for a json or jsonb payload (a trigger's row_to_json(NEW), to_jsonb(NEW)): a
-- json value is sent as its text is written; a jsonb one as PostgreSQL prints it.
CREATE FUNCTION poller_enqueue(
    endpoint text, event_type text, payload json, idempotency_key text,
    ordering_key text DEFAULT NULL, deliver_at timestamptz DEFAULT NULL,
    deliver_after interval DEFAULT NULL, max_attempts integer DEFAULT NULL,
    traceparent text DEFAULT NULL, tracestate text DEFAULT NULL
) RETURNS bigint
LANGUAGE sql AS $$
    SELECT poller_enqueue($1, $2, CAST($3 AS text), $4, $5, $6, $7, $8, $9, $10)
$$;
CREATE FUNCTION poller_enqueue(
    endpoint text, event_type text, payload jsonb, idempotency_key text,
    ordering_key text DEFAULT NULL, deliver_at timestamptz DEFAULT NULL,
    deliver_after interval DEFAULT NULL, max_attempts integer DEFAULT NULL,
    traceparent text DEFAULT NULL, tracestate text DEFAULT NULL
) RETURNS bigint
LANGUAGE sql AS $$
    SELECT poller_enqueue($1, $2, CAST($3 AS text), $4, $5, $6, $7, $8, $9, $10)
$$;

-- Enqueue many messages in one call: the arrays are the messages' columns (a NULL array:
-- that column's default for every message); their ids in the order given. Everything is
-- checked before anything is written; a refusal raises, and the caller's transaction
-- (or savepoint) undoes the call's rows. An (endpoint, key) given twice is one message
-- (the same content) or a conflict.
CREATE FUNCTION poller_enqueue_many(
    endpoints text[], event_types text[], payloads text[], idempotency_keys text[],
    ordering_keys text[] DEFAULT NULL, deliver_ats timestamptz[] DEFAULT NULL,
    deliver_afters interval[] DEFAULT NULL, max_attempts integer[] DEFAULT NULL,
    traceparent text DEFAULT NULL, tracestate text DEFAULT NULL,
    max_payload_bytes integer DEFAULT NULL, default_max_attempts integer DEFAULT NULL,
    notify boolean DEFAULT NULL
) RETURNS bigint[]
LANGUAGE plpgsql AS $$
-- The arrays are read a row at a time through one unnest, never by subscript: a text
-- array's element n is found by walking the n before it (10,000 messages: seconds).
DECLARE
    n integer := coalesce(cardinality($4), 0);
    limit_bytes integer := coalesce($11, poller_setting('max_payload_bytes', '262144')::integer);
    budget integer := coalesce($12, poller_setting('max_attempts', '10')::integer);
    bad record;
    u record;  -- the batch's first occurrences of each (endpoint, key), column by column
    ep_ids bigint[];
    ep_budgets integer[];
    ids bigint[];
BEGIN
    IF n = 0 THEN
        RETURN '{}';
    END IF;
    IF cardinality($1) IS DISTINCT FROM n OR cardinality($2) IS DISTINCT FROM n
       OR cardinality($3) IS DISTINCT FROM n
       OR ($5 IS NOT NULL AND cardinality($5) <> n) OR ($6 IS NOT NULL AND cardinality($6) <> n)
       OR ($7 IS NOT NULL AND cardinality($7) <> n) OR ($8 IS NOT NULL AND cardinality($8) <> n) THEN
        PERFORM poller_raise(ARRAY['WP000', 'the arrays must have one element per message',
            '{"field": "endpoints"}']);
    END IF;
    SELECT c.at, c.r INTO bad
    FROM (SELECT m.at, poller_refusal(m.et, m.pl, m.k, m.ok, m.dat, m.daf, m.ma, limit_bytes) AS r
          FROM unnest($1, $2, $3, $4, $5, $6, $7, $8) WITH ORDINALITY
              AS m(ep, et, pl, k, ok, dat, daf, ma, at)) AS c
    WHERE c.r IS NOT NULL ORDER BY c.at LIMIT 1;
    IF FOUND THEN
        PERFORM poller_raise(ARRAY[bad.r[1], format('messages[%s]: %s', bad.at - 1, bad.r[2]),
                                   bad.r[3]]);
    END IF;
    -- An (endpoint, key) given twice is one message (the same content) or a conflict.
    WITH f AS (
        SELECT m.*, CAST(m.pl AS jsonb) AS j,
               first_value(m.at) OVER w AS f, first_value(m.et) OVER w AS fet,
               first_value(CAST(m.pl AS jsonb)) OVER w AS fj, first_value(m.ok) OVER w AS fok
        FROM unnest($1, $2, $3, $4, $5, $6, $7, $8) WITH ORDINALITY
            AS m(ep, et, pl, k, ok, dat, daf, ma, at)
        WINDOW w AS (PARTITION BY m.ep, m.k ORDER BY m.at)
    )
    SELECT array_agg(f.f ORDER BY f.at) AS firsts,
           min(f.at) FILTER (WHERE f.et IS DISTINCT FROM f.fet OR f.j IS DISTINCT FROM f.fj
                                   OR f.ok IS DISTINCT FROM f.fok) AS clash,
           array_agg(f.ep ORDER BY f.at) FILTER (WHERE f.at = f.f) AS ep,
           array_agg(f.et ORDER BY f.at) FILTER (WHERE f.at = f.f) AS et,
           array_agg(CAST(f.pl AS json) ORDER BY f.at) FILTER (WHERE f.at = f.f) AS pl,
           array_agg(f.k ORDER BY f.at) FILTER (WHERE f.at = f.f) AS k,
           array_agg(f.ok ORDER BY f.at) FILTER (WHERE f.at = f.f) AS ok,
           array_agg(f.dat ORDER BY f.at) FILTER (WHERE f.at = f.f) AS dat,
           array_agg(coalesce(extract(epoch FROM f.daf), 0) ORDER BY f.at)
               FILTER (WHERE f.at = f.f) AS delay,
           array_agg(f.ma ORDER BY f.at) FILTER (WHERE f.at = f.f) AS ma
    INTO u FROM f;
    IF u.clash IS NOT NULL THEN
        SELECT m.ep, m.k INTO bad FROM unnest($1, $4) WITH ORDINALITY AS m(ep, k, at)
        WHERE m.at = u.clash;
        PERFORM poller_raise(ARRAY['WP011', format('idempotency key %L of endpoint %L is given '
            'twice in the batch with other content', bad.k, bad.ep),
            json_build_object('endpoint', bad.ep, 'idempotency_key', bad.k,
                              'existing_id', -1)::text]);
    END IF;
    SELECT array_agg(e.id ORDER BY e.ord), array_agg(e.max_attempts ORDER BY e.ord)
    INTO ep_ids, ep_budgets
    FROM poller_endpoints_for(u.ep) WITH ORDINALITY AS e(name, id, max_attempts, ord);
    ids := poller_insert_rows(
        ep_ids, u.et, u.pl, u.k,
        ARRAY(SELECT coalesce(b.given, b.endpoint_s, budget)
              FROM unnest(u.ma, ep_budgets) WITH ORDINALITY AS b(given, endpoint_s, ord)
              ORDER BY b.ord),
        u.dat, u.delay, u.ok, NULL, $9, $10,
        coalesce($13, poller_setting('notify', 'on')::boolean));
    -- the first occurrences are the firsts' distinct values in order: a message's is its
    -- first's dense rank among them (bigint[] without NULLs: a subscript is O(1))
    RETURN ARRAY(
        SELECT ids[q.pos]
        FROM (SELECT fo.o, dense_rank() OVER (ORDER BY fo.f) AS pos
              FROM unnest(u.firsts) WITH ORDINALITY AS fo(f, o)) AS q
        ORDER BY q.o);
END
$$;

-- One event without an ordering key, published or refused, raising nothing: the
-- event's id, whether this call made it (an idempotent repeat: false, and nothing
-- added), its deliveries (JSON [[endpoint, message id], …]), the catalog's JSON Schema
-- for its type (a door that can check it does, and calls poller_unpublish if it does
-- not hold), and a refusal's SQLSTATE, message and detail. An event with an ordering
-- key goes through poller_publish_many.
CREATE FUNCTION poller_try_publish(
    p_event_type text, p_payload text, p_idempotency_key text, p_tenant text,
    p_deliver_at timestamptz, p_deliver_after interval, p_traceparent text, p_tracestate text,
    p_payload_checked boolean, p_max_payload_bytes integer, p_default_max_attempts integer,
    p_notify boolean
) RETURNS TABLE (event_id bigint, created boolean, deliveries json, schema text,
                 sqlstate text, message text, detail text)
LANGUAGE plpgsql AS $$
DECLARE
    refusal text[];
    r record;
    skipped record;
    existing record;
    delay double precision := coalesce(extract(epoch FROM p_deliver_after), 0);
    budget integer := coalesce(p_default_max_attempts, poller_setting('max_attempts', '10')::integer);
BEGIN
    refusal := coalesce(poller_refusal(p_event_type, p_payload, p_idempotency_key, NULL,
        p_deliver_at, p_deliver_after, NULL,
        coalesce(p_max_payload_bytes, poller_setting('max_payload_bytes', '262144')::integer)),
        poller_tenant_refusal(p_tenant));
    IF refusal IS NOT NULL THEN
        RETURN QUERY SELECT NULL::bigint, NULL::boolean, NULL::json, NULL::text,
                            refusal[1], refusal[2], refusal[3];
        RETURN;
    END IF;
    WITH doc AS (
        SELECT CAST(p_payload AS jsonb) AS j,
               ARRAY(SELECT left(p_event_type, k) || '*'
                     FROM generate_series(0, char_length(p_event_type)) AS k) || p_event_type
                   AS matching
    ), targets AS (
        SELECT e.id, e.name, e.bucket, e.max_attempts
        FROM poller_endpoints e, doc
        WHERE e.enabled AND coalesce(e.tenant, '') = coalesce(p_tenant, '')
          AND e.event_types && doc.matching
          AND (e.payload_filter IS NULL OR doc.j @> e.payload_filter)
    ), ev AS (
        INSERT INTO poller_events
            (event_type, payload, idempotency_key, tenant, fanned_out, traceparent, tracestate,
             payload_checked)
        SELECT p_event_type, CAST(p_payload AS json), p_idempotency_key, p_tenant,
               (SELECT count(*) FROM targets), p_traceparent, p_tracestate,
               coalesce(p_payload_checked, false)
               OR NOT EXISTS (SELECT 1 FROM poller_event_types c WHERE c.name = p_event_type
                              AND c.schema IS NOT NULL)
        ON CONFLICT ((coalesce(tenant, '')), idempotency_key) DO NOTHING
        RETURNING id
    ), ins AS (
        INSERT INTO poller_outbox
            (endpoint_id, bucket, event_type, idempotency_key, max_attempts, next_attempt_at,
             event_id)
        SELECT t.id, t.bucket, p_event_type, p_idempotency_key, coalesce(t.max_attempts, budget),
               coalesce(p_deliver_at, now() + make_interval(secs => delay)), ev.id
        FROM ev CROSS JOIN targets t
        WHERE NOT EXISTS (SELECT 1 FROM poller_spent_keys k
                          WHERE k.endpoint_id = t.id AND k.idempotency_key = p_idempotency_key)
        ORDER BY t.id
        ON CONFLICT (endpoint_id, idempotency_key) DO NOTHING
        RETURNING id, endpoint_id, bucket
    )
    SELECT (SELECT id FROM ev) AS event_id,
           (SELECT coalesce(json_agg(json_build_array(t.name, i.id) ORDER BY t.name), '[]')
            FROM ins i JOIN targets t ON t.id = i.endpoint_id) AS deliveries,
           (SELECT array_agg(t.name ORDER BY t.name) FROM targets t
            WHERE EXISTS (SELECT 1 FROM ev)
              AND NOT EXISTS (SELECT 1 FROM ins WHERE ins.endpoint_id = t.id)) AS skipped,
           (SELECT count(pg_notify('poller_outbox', CAST(b.bucket AS text)))
            FROM (SELECT DISTINCT bucket FROM ins) AS b
            WHERE coalesce(p_notify, poller_setting('notify', 'on')::boolean)) AS woke,
           (SELECT CAST(c.schema AS text) FROM poller_event_types c
            WHERE c.name = p_event_type) AS schema
    INTO r;
    IF r.event_id IS NULL THEN  -- published before with this key
        SELECT ev.id, (CAST(ev.payload AS jsonb) = CAST(p_payload AS jsonb)
                       AND ev.event_type = p_event_type AND ev.ordering_key IS NULL) AS same,
               (SELECT coalesce(json_agg(json_build_array(e.name, o.id) ORDER BY e.name), '[]')
                FROM poller_outbox o JOIN poller_endpoints e ON e.id = o.endpoint_id
                WHERE o.event_id = ev.id) AS deliveries
        INTO existing
        FROM poller_events ev
        WHERE coalesce(ev.tenant, '') = coalesce(p_tenant, '')
          AND ev.idempotency_key = p_idempotency_key;
        IF NOT FOUND THEN  -- purged between the insert and this read
            RETURN QUERY SELECT NULL::bigint, NULL::boolean, NULL::json, NULL::text, 'WP013',
                format('idempotency key %L was spent: its event was purged',
                       p_idempotency_key),
                json_build_object('tenant', p_tenant, 'idempotency_key', p_idempotency_key)::text;
        ELSIF NOT existing.same THEN
            RETURN QUERY SELECT NULL::bigint, NULL::boolean, NULL::json, NULL::text, 'WP012',
                format('idempotency key %L%s is taken by event %s with other content',
                       p_idempotency_key,
                       CASE WHEN p_tenant IS NULL THEN '' ELSE format(' of tenant %L', p_tenant) END,
                       existing.id),
                json_build_object('tenant', p_tenant, 'idempotency_key', p_idempotency_key,
                                  'existing_id', existing.id)::text;
        ELSE
            RETURN QUERY SELECT existing.id, false, existing.deliveries, NULL::text,
                                NULL::text, NULL::text, NULL::text;
        END IF;
        RETURN;
    END IF;
    IF r.skipped IS NOT NULL THEN  -- a row could not be added: undo the event
        SELECT e.name, o.id AS existing_id INTO skipped
        FROM poller_endpoints e
        LEFT JOIN poller_outbox o ON o.endpoint_id = e.id AND o.idempotency_key = p_idempotency_key
        WHERE e.name = r.skipped[1];
        DELETE FROM poller_outbox WHERE poller_outbox.event_id = r.event_id;
        DELETE FROM poller_events WHERE id = r.event_id;
        IF skipped.existing_id IS NOT NULL THEN
            RETURN QUERY SELECT NULL::bigint, NULL::boolean, NULL::json, NULL::text, 'WP011',
                format('idempotency key %L of endpoint %L is taken by message %s with other '
                       'content', p_idempotency_key, skipped.name, skipped.existing_id),
                json_build_object('endpoint', skipped.name, 'idempotency_key', p_idempotency_key,
                                  'existing_id', skipped.existing_id)::text;
        ELSE
            RETURN QUERY SELECT NULL::bigint, NULL::boolean, NULL::json, NULL::text, 'WP013',
                format('idempotency key %L was spent on endpoint %L: its message was purged, '
                       'and a key is never delivered twice', p_idempotency_key, skipped.name),
                json_build_object('endpoint', skipped.name,
                                  'idempotency_key', p_idempotency_key)::text;
        END IF;
        RETURN;
    END IF;
    RETURN QUERY SELECT r.event_id, true, r.deliveries, r.schema, NULL::text, NULL::text,
                        NULL::text;
END
$$;

-- Undo a publish this transaction made (a door that checked the payload against the
-- catalog's schema, and found it did not hold): its rows and the event go.
CREATE FUNCTION poller_unpublish(p_event_id bigint) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM poller_outbox WHERE event_id = p_event_id;
    DELETE FROM poller_events WHERE id = p_event_id;
$$;

-- Publish many events in one call (any with an ordering key too: each endpoint's rows
-- are placed behind its key's head): the arrays are the events' columns; a row per event
-- in the order given — its id, whether this call made it, its deliveries, the catalog's
-- schema for its type. Everything is checked first; a refusal raises.
CREATE FUNCTION poller_publish_many(
    event_types text[], payloads text[], idempotency_keys text[], tenants text[] DEFAULT NULL,
    ordering_keys text[] DEFAULT NULL, deliver_ats timestamptz[] DEFAULT NULL,
    deliver_afters interval[] DEFAULT NULL, traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL, payload_checked boolean DEFAULT NULL,
    max_payload_bytes integer DEFAULT NULL, default_max_attempts integer DEFAULT NULL,
    notify boolean DEFAULT NULL
) RETURNS TABLE (event_id bigint, created boolean, deliveries json, schema text)
LANGUAGE plpgsql AS $$
-- As poller_enqueue_many: the arrays are read through unnest, never by subscript, and
-- rows are matched through jsonb maps, never by joining two unnests (the planner takes
-- each for a few rows: a nested loop over 10,000 both ways took seconds).
DECLARE
    n integer := coalesce(cardinality($3), 0);
    limit_bytes integer := coalesce($11, poller_setting('max_payload_bytes', '262144')::integer);
    budget integer := coalesce($12, poller_setting('max_attempts', '10')::integer);
    bad record;
    u record;          -- the batch's first occurrences of each (tenant, key), by column
    got jsonb;
    new_ids bigint[];  -- per first occurrence: the event made here, or NULL
    t record;
    rows_ids bigint[];
    made jsonb;        -- first occurrence's place -> the deliveries of an event made here
    results jsonb;     -- first occurrence's place -> [id, created, deliveries, schema]
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;
    IF cardinality($1) IS DISTINCT FROM n OR cardinality($2) IS DISTINCT FROM n
       OR ($4 IS NOT NULL AND cardinality($4) <> n) OR ($5 IS NOT NULL AND cardinality($5) <> n)
       OR ($6 IS NOT NULL AND cardinality($6) <> n) OR ($7 IS NOT NULL AND cardinality($7) <> n) THEN
        PERFORM poller_raise(ARRAY['WP000', 'the arrays must have one element per event',
            '{"field": "event_types"}']);
    END IF;
    SELECT c.at, c.r INTO bad
    FROM (SELECT m.at, coalesce(poller_refusal(m.et, m.pl, m.k, m.ok, m.dat, m.daf, NULL,
                                               limit_bytes),
                                poller_tenant_refusal(m.te)) AS r
          FROM unnest($1, $2, $3, $4, $5, $6, $7) WITH ORDINALITY
              AS m(et, pl, k, te, ok, dat, daf, at)) AS c
    WHERE c.r IS NOT NULL ORDER BY c.at LIMIT 1;
    IF FOUND THEN
        PERFORM poller_raise(ARRAY[bad.r[1], format('events[%s]: %s', bad.at - 1, bad.r[2]),
                                   bad.r[3]]);
    END IF;
    -- A (tenant, key) given twice is one event (the same content) or a conflict.
    WITH f AS (
        SELECT m.*, CAST(m.pl AS jsonb) AS j,
               first_value(m.at) OVER w AS f, first_value(m.et) OVER w AS fet,
               first_value(CAST(m.pl AS jsonb)) OVER w AS fj, first_value(m.ok) OVER w AS fok
        FROM unnest($1, $2, $3, $4, $5, $6, $7) WITH ORDINALITY
            AS m(et, pl, k, te, ok, dat, daf, at)
        WINDOW w AS (PARTITION BY coalesce(m.te, ''), m.k ORDER BY m.at)
    )
    SELECT array_agg(f.f ORDER BY f.at) AS firsts,
           min(f.at) FILTER (WHERE f.et IS DISTINCT FROM f.fet OR f.j IS DISTINCT FROM f.fj
                                   OR f.ok IS DISTINCT FROM f.fok) AS clash,
           array_agg(f.et ORDER BY f.at) FILTER (WHERE f.at = f.f) AS et,
           array_agg(f.pl ORDER BY f.at) FILTER (WHERE f.at = f.f) AS pl,
           array_agg(f.k ORDER BY f.at) FILTER (WHERE f.at = f.f) AS k,
           array_agg(f.te ORDER BY f.at) FILTER (WHERE f.at = f.f) AS te,
           array_agg(f.ok ORDER BY f.at) FILTER (WHERE f.at = f.f) AS ok,
           array_agg(f.dat ORDER BY f.at) FILTER (WHERE f.at = f.f) AS dat,
           array_agg(coalesce(extract(epoch FROM f.daf), 0) ORDER BY f.at)
               FILTER (WHERE f.at = f.f) AS delay
    INTO u FROM f;
    IF u.clash IS NOT NULL THEN
        SELECT m.te, m.k INTO bad FROM unnest($4, $3) WITH ORDINALITY AS m(te, k, at)
        WHERE m.at = u.clash;
        PERFORM poller_raise(ARRAY['WP012', format('idempotency key %L is given twice in the '
            'batch with other content', bad.k), json_build_object('tenant', bad.te,
            'idempotency_key', bad.k, 'existing_id', -1)::text]);
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(u.ok) AS k WHERE k IS NOT NULL) THEN
        -- before the events get their ids, which are their positions
        PERFORM count(pg_advisory_xact_lock(s.lock_id))
        FROM (SELECT DISTINCT hashtextextended(k, 0) AS lock_id
              FROM unnest(u.ok) AS k WHERE k IS NOT NULL ORDER BY 1 OFFSET 0) AS s;
    END IF;
    -- The new events, in the order given; those published before are left out.
    WITH ins AS (
        INSERT INTO poller_events
            (event_type, payload, idempotency_key, tenant, ordering_key, traceparent, tracestate,
             payload_checked)
        SELECT m.et, CAST(m.pl AS json), m.k, m.te, m.ok, $8, $9,
               coalesce($10, false) OR NOT EXISTS (
                   SELECT 1 FROM poller_event_types c WHERE c.name = m.et AND c.schema IS NOT NULL)
        FROM unnest(u.et, u.pl, u.k, u.te, u.ok) WITH ORDINALITY AS m(et, pl, k, te, ok, ord)
        ORDER BY m.ord
        ON CONFLICT ((coalesce(tenant, '')), idempotency_key) DO NOTHING
        RETURNING poller_events.id, poller_events.idempotency_key, poller_events.tenant
    )
    SELECT jsonb_object_agg(coalesce(ins.tenant, '') || E'\x01' || ins.idempotency_key, ins.id)
    INTO got FROM ins;
    new_ids := ARRAY(
        SELECT (got ->> (coalesce(m.te, '') || E'\x01' || m.k))::bigint
        FROM unnest(u.te, u.k) WITH ORDINALITY AS m(te, k, ord) ORDER BY m.ord);
    -- Those published before: the same content is their result, other is a conflict.
    SELECT m.k, m.te, e.id INTO bad
    FROM unnest(u.et, u.pl, u.k, u.te, u.ok, new_ids) AS m(et, pl, k, te, ok, new_id)
    LEFT JOIN poller_events e
      ON coalesce(e.tenant, '') = coalesce(m.te, '') AND e.idempotency_key = m.k
    WHERE m.new_id IS NULL
      AND (e.id IS NULL OR CAST(e.payload AS jsonb) <> CAST(m.pl AS jsonb)
           OR e.event_type <> m.et OR e.ordering_key IS DISTINCT FROM m.ok)
    LIMIT 1;
    IF FOUND AND bad.id IS NULL THEN
        PERFORM poller_raise(ARRAY['WP013', format('idempotency key %L was spent: its event was '
            'purged', bad.k), json_build_object('tenant', bad.te, 'idempotency_key', bad.k)::text]);
    ELSIF FOUND THEN
        PERFORM poller_raise(ARRAY['WP012', format('idempotency key %L%s is taken by event %s '
            'with other content', bad.k,
            CASE WHEN bad.te IS NULL THEN '' ELSE format(' of tenant %L', bad.te) END, bad.id),
            json_build_object('tenant', bad.te, 'idempotency_key', bad.k,
                              'existing_id', bad.id)::text]);
    END IF;
    -- Each new event's enabled endpoints, its count recorded, its rows through the kernel.
    WITH evs AS MATERIALIZED (
        SELECT e.id, e.tenant, e.event_type, e.idempotency_key, e.ordering_key,
               CAST(e.payload AS jsonb) AS j, m.ord, m.dat, m.delay,
               ARRAY(SELECT left(e.event_type, k) || '*'
                     FROM generate_series(0, char_length(e.event_type)) AS k)
                   || e.event_type AS matching
        FROM unnest(new_ids, u.dat, u.delay) WITH ORDINALITY AS m(id, dat, delay, ord)
        JOIN poller_events e ON e.id = m.id
    )
    SELECT array_agg(evs.id ORDER BY evs.id, p.id) AS eids,
           array_agg(evs.ord ORDER BY evs.id, p.id) AS ords,
           array_agg(evs.event_type ORDER BY evs.id, p.id) AS event_types,
           array_agg(evs.idempotency_key ORDER BY evs.id, p.id) AS idempotency_keys,
           array_agg(evs.ordering_key ORDER BY evs.id, p.id) AS ordering_keys,
           array_agg(evs.dat ORDER BY evs.id, p.id) AS dats,
           array_agg(evs.delay ORDER BY evs.id, p.id) AS delays,
           array_agg(p.id ORDER BY evs.id, p.id) AS endpoint_ids,
           array_agg(p.name ORDER BY evs.id, p.id) AS names,
           array_agg(coalesce(p.max_attempts, budget) ORDER BY evs.id, p.id) AS budgets
    INTO t
    FROM evs JOIN poller_endpoints p
      ON p.enabled AND coalesce(p.tenant, '') = coalesce(evs.tenant, '')
     AND p.event_types && evs.matching
     AND (p.payload_filter IS NULL OR evs.j @> p.payload_filter);
    made := '{}';
    IF t.eids IS NOT NULL THEN
        UPDATE poller_events e SET fanned_out = c.n
        FROM (SELECT eid, count(*) AS n FROM unnest(t.eids) AS eid GROUP BY eid) AS c
        WHERE e.id = c.eid;
        rows_ids := poller_insert_rows(
            t.endpoint_ids, t.event_types, NULL, t.idempotency_keys, t.budgets, t.dats, t.delays,
            t.ordering_keys, t.eids, NULL, NULL,  -- the rows read their event's trace
            coalesce($13, poller_setting('notify', 'on')::boolean));
        SELECT jsonb_object_agg(d.ord::text, d.deliveries) INTO made
        FROM (SELECT d.ord, jsonb_agg(jsonb_build_array(d.name, d.id) ORDER BY d.name)
                  AS deliveries
              FROM unnest(t.ords, t.names, rows_ids) AS d(ord, name, id) GROUP BY d.ord) AS d;
    END IF;
    SELECT jsonb_object_agg(m.ord::text, jsonb_build_array(
               coalesce(m.new_id, e.id), m.new_id IS NOT NULL,
               CASE WHEN m.new_id IS NOT NULL THEN coalesce(made -> m.ord::text, '[]')
                    ELSE (SELECT coalesce(jsonb_agg(jsonb_build_array(p.name, o.id)
                                                    ORDER BY p.name), '[]')
                          FROM poller_outbox o JOIN poller_endpoints p ON p.id = o.endpoint_id
                          WHERE o.event_id = e.id) END,
               CASE WHEN m.new_id IS NOT NULL
                    THEN (SELECT CAST(c.schema AS text) FROM poller_event_types c
                          WHERE c.name = m.et) END))
    INTO results
    FROM unnest(new_ids, u.te, u.k, u.et) WITH ORDINALITY AS m(new_id, te, k, et, ord)
    LEFT JOIN poller_events e
      ON m.new_id IS NULL AND coalesce(e.tenant, '') = coalesce(m.te, '') AND e.idempotency_key = m.k;
    -- the first occurrences are the firsts' distinct values in order: an event's is its
    -- first's dense rank among them
    RETURN QUERY
        SELECT (results -> q.pos::text ->> 0)::bigint, (results -> q.pos::text ->> 1)::boolean,
               CAST(results -> q.pos::text -> 2 AS json), results -> q.pos::text ->> 3
        FROM (SELECT fo.o, dense_rank() OVER (ORDER BY fo.f) AS pos
              FROM unnest(u.firsts) WITH ORDINALITY AS fo(f, o)) AS q
        ORDER BY q.o;
END
$$;

-- Publish one event in the caller's transaction to every enabled endpoint subscribed
-- to it (by type, tenant and payload filter); the event's id (a repeat: the first's).
-- A refusal raises its SQLSTATE. A payload whose type has a JSON Schema in the
-- catalog is checked by the poller before it is sent (the database cannot check it):
-- one that does not hold fails unsent, with the schema's words as its error.
CREATE FUNCTION poller_publish(
    event_type text, payload text, idempotency_key text, tenant text DEFAULT NULL,
    ordering_key text DEFAULT NULL, deliver_at timestamptz DEFAULT NULL,
    deliver_after interval DEFAULT NULL, traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF $5 IS NOT NULL THEN
        RETURN (SELECT p.event_id FROM poller_publish_many(ARRAY[$1], ARRAY[$2], ARRAY[$3],
            ARRAY[$4], ARRAY[$5], ARRAY[$6], ARRAY[$7], $8, $9) AS p);
    END IF;
    SELECT * INTO r FROM poller_try_publish($1, $2, $3, $4, $6, $7, $8, $9, NULL, NULL, NULL, NULL);
    IF r.sqlstate IS NOT NULL THEN
        PERFORM poller_raise(ARRAY[r.sqlstate, r.message, r.detail]);
    END IF;
    RETURN r.event_id;
END
$$;
CREATE FUNCTION poller_publish(
    event_type text, payload json, idempotency_key text, tenant text DEFAULT NULL,
    ordering_key text DEFAULT NULL, deliver_at timestamptz DEFAULT NULL,
    deliver_after interval DEFAULT NULL, traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL
) RETURNS bigint
LANGUAGE sql AS $$
    SELECT poller_publish($1, CAST($2 AS text), $3, $4, $5, $6, $7, $8, $9)
$$;
CREATE FUNCTION poller_publish(
    event_type text, payload jsonb, idempotency_key text, tenant text DEFAULT NULL,
    ordering_key text DEFAULT NULL, deliver_at timestamptz DEFAULT NULL,
    deliver_after interval DEFAULT NULL, traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL
) RETURNS bigint
LANGUAGE sql AS $$
    SELECT poller_publish($1, CAST($2 AS text), $3, $4, $5, $6, $7, $8, $9)
$$;
