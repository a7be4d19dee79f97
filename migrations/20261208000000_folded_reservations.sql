-- A reservation that took a single bucket is kept in its order's row (`orders.bucket`)
-- instead of a reservation line: one row, its index entry and its WAL fewer per purchase.
-- Lines stay for an order spread over several buckets and for units taken again after a
-- late payment. The order's column is cleared in the update that gives its units back, so
-- an order holds units through its lines not yet released and its bucket, if any.
--
-- Orders are now inserted after inventory has decided, and only those reserved: a refused
-- request writes nothing, and every order is inserted under its user's counter lock (taken
-- first by inventory), so no batch waits on another's key while holding buckets.
ALTER TABLE orders ADD COLUMN bucket INTEGER;

-- What every order holds, wherever it is kept: the one definition the audit, the inventory
-- snapshot and the tests read.
CREATE VIEW held_units AS
SELECT order_id, deal_id, bucket, quantity FROM reservation_lines WHERE released_at IS NULL
UNION ALL
SELECT id, deal_id, bucket, quantity FROM orders WHERE bucket IS NOT NULL;

-- Nothing deletes orders any more: the trigger that took a refused order's event with it
-- has nothing left to do.
DROP TRIGGER events_orders_deleted ON orders;
DROP FUNCTION events_orders_deleted();

DROP FUNCTION inventory_reserve_batch(text, uuid[], text[], int[], int[], int, int[], boolean,
                                      boolean);

CREATE OR REPLACE FUNCTION inventory_reserve_batch(
    p_deal text, p_orders uuid[], p_users text[], p_units int[], p_after int[],
    p_limit int, p_share int[], p_wait_all boolean, p_new_users boolean, p_fold boolean,
    OUT outcomes text[], OUT left_after bigint[], OUT buckets int[], OUT ran_out boolean)
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    requests int := coalesce(cardinality(p_orders), 0);
    users text[];
    held int[];
    stored int[];
    created boolean[];
    b_id int[];
    b_av bigint[];
    b_took bigint[];
    total bigint;
    l_order uuid[] := '{}';
    l_bucket int[] := '{}';
    l_units int[] := '{}';
    stopped boolean := false;
    taken int := 0;
    changed int := 0;
    emptied int := 0;
    k int; u int; q int; i int; j int; got int; prev int; lines_before int;
    want bigint; take bigint;
    more record;
BEGIN
    ASSERT cardinality(p_users) = requests AND cardinality(p_units) = requests
       AND cardinality(p_after) = requests, 'one entry per request in every array';
    outcomes := array_fill(NULL::text, ARRAY[requests]);
    left_after := array_fill(NULL::bigint, ARRAY[requests]);
    buckets := array_fill(NULL::int, ARRAY[requests]);
    ran_out := false;
    -- 1. Counters, in user order: a missing row is created holding what the user's first
    --    request asks, an existing one locked unchanged. `held` is what each user holds
    --    before the batch (0 for a new row), `stored` what the row holds now. A caller
    --    that expects every user to be new says so (`p_new_users`): the rows are then
    --    inserted plainly, and a user who has a row already raises `unique_violation`.
    IF p_new_users THEN
        WITH asked AS (
            SELECT DISTINCT ON (t.u) t.u, CASE WHEN t.q <= p_limit THEN t.q ELSE 0 END AS first
              FROM unnest(p_users, p_units) WITH ORDINALITY AS t(u, q, k)
             WHERE t.q > 0
             ORDER BY t.u, t.k),
        locked AS (
            INSERT INTO user_deal_units AS c (deal_id, user_id, units, limit_units)
            SELECT p_deal, a.u, a.first, p_limit FROM asked a ORDER BY a.u
            RETURNING c.user_id, c.units, true AS created)
        SELECT array_agg(l.user_id ORDER BY l.user_id),
               array_agg(CASE WHEN l.created THEN 0 ELSE l.units END ORDER BY l.user_id),
               array_agg(l.units ORDER BY l.user_id), array_agg(l.created ORDER BY l.user_id)
          INTO users, held, stored, created FROM locked l;
    ELSE
        WITH asked AS (
            SELECT DISTINCT ON (t.u) t.u, CASE WHEN t.q <= p_limit THEN t.q ELSE 0 END AS first
              FROM unnest(p_users, p_units) WITH ORDINALITY AS t(u, q, k)
             WHERE t.q > 0
             ORDER BY t.u, t.k),
        locked AS (
            INSERT INTO user_deal_units AS c (deal_id, user_id, units, limit_units)
            SELECT p_deal, a.u, a.first, p_limit FROM asked a ORDER BY a.u
            ON CONFLICT (deal_id, user_id) DO UPDATE SET units = c.units
            RETURNING c.user_id, c.units, c.xmax = 0 AS created)
        SELECT array_agg(l.user_id ORDER BY l.user_id),
               array_agg(CASE WHEN l.created THEN 0 ELSE l.units END ORDER BY l.user_id),
               array_agg(l.units ORDER BY l.user_id), array_agg(l.created ORDER BY l.user_id)
          INTO users, held, stored, created FROM locked l;
    END IF;
    IF users IS NULL THEN
        RETURN;
    END IF;
    -- 2. Buckets: the lane's share without waiting, or every non-empty one, waiting.
    IF p_wait_all THEN
        SELECT array_agg(s.bucket ORDER BY s.bucket), array_agg(s.available ORDER BY s.bucket),
               sum(s.available)
          INTO b_id, b_av, total
          FROM (SELECT b.bucket, b.available FROM inventory_buckets b
                 WHERE b.deal_id = p_deal AND b.available > 0
                 ORDER BY b.bucket FOR NO KEY UPDATE) s;
    ELSE
        SELECT array_agg(s.bucket ORDER BY s.bucket), array_agg(s.available ORDER BY s.bucket),
               sum(s.available)
          INTO b_id, b_av, total
          FROM (SELECT b.bucket, b.available FROM inventory_buckets b
                 WHERE b.deal_id = p_deal AND b.available > 0 AND b.bucket = ANY (p_share)
                 ORDER BY b.bucket FOR NO KEY UPDATE SKIP LOCKED) s;
    END IF;
    b_id := coalesce(b_id, '{}');
    b_av := coalesce(b_av, '{}');
    b_took := array_fill(0::bigint, ARRAY[cardinality(b_id)]);
    total := coalesce(total, 0);
    -- 3. Each request in arrival order, against what the earlier ones left.
    FOR k IN 1..requests LOOP
        q := p_units[k];
        CONTINUE WHEN q <= 0;
        IF stopped THEN
            outcomes[k] := 'undecided';
            CONTINUE;
        END IF;
        prev := p_after[k];
        IF prev > 0 AND outcomes[prev] IN ('reserved', 'skipped') THEN
            outcomes[k] := 'skipped';
            CONTINUE;
        END IF;
        u := array_position(users, p_users[k]);
        IF held[u] + q > p_limit THEN
            outcomes[k] := 'per_user_limit';
            CONTINUE;
        END IF;
        IF total < q AND NOT p_wait_all THEN
            -- Spill: more non-empty buckets, fullest first, never waiting for one.
            LOOP
                got := 0;
                FOR more IN
                    SELECT b.bucket, b.available FROM inventory_buckets b
                     WHERE b.deal_id = p_deal AND b.available > 0 AND b.bucket <> ALL (b_id)
                     ORDER BY b.available DESC LIMIT 4 FOR NO KEY UPDATE SKIP LOCKED
                LOOP
                    b_id := b_id || more.bucket;
                    b_av := b_av || more.available;
                    b_took := b_took || 0::bigint;
                    total := total + more.available;
                    got := got + 1;
                END LOOP;
                EXIT WHEN got = 0 OR total >= q;
            END LOOP;
            IF total < q AND EXISTS (
                SELECT 1 FROM inventory_buckets b
                 WHERE b.deal_id = p_deal AND b.available > 0 AND b.bucket <> ALL (b_id)) THEN
                -- Units exist only in buckets another transaction holds: deciding now
                -- could answer sold out wrongly, so this request and the rest wait.
                stopped := true;
                outcomes[k] := 'undecided';
                CONTINUE;
            END IF;
        END IF;
        IF total < q THEN
            outcomes[k] := 'sold_out';
            left_after[k] := total;
            CONTINUE;
        END IF;
        -- Take: the first bucket that covers the order, else the fullest ones in turn.
        want := q;
        lines_before := cardinality(l_order);
        WHILE want > 0 LOOP
            i := NULL;
            FOR j IN 1..cardinality(b_id) LOOP
                IF b_av[j] >= want THEN i := j; EXIT; END IF;
            END LOOP;
            IF i IS NULL THEN
                i := 1;
                FOR j IN 2..cardinality(b_id) LOOP
                    IF b_av[j] > b_av[i] THEN i := j; END IF;
                END LOOP;
            END IF;
            take := least(b_av[i], want);
            ASSERT take > 0, 'the locked buckets cover what they were counted to cover';
            IF b_took[i] = 0 THEN taken := taken + 1; END IF;
            b_av[i] := b_av[i] - take;
            b_took[i] := b_took[i] + take;
            l_order := l_order || p_orders[k];
            l_bucket := l_bucket || b_id[i];
            l_units := l_units || take::int;
            want := want - take;
        END LOOP;
        IF p_fold AND cardinality(l_order) = lines_before + 1 THEN
            buckets[k] := l_bucket[lines_before + 1];
            l_order := l_order[1:lines_before];
            l_bucket := l_bucket[1:lines_before];
            l_units := l_units[1:lines_before];
        END IF;
        held[u] := held[u] + q;
        total := total - q;
        outcomes[k] := 'reserved';
        left_after[k] := total;
    END LOOP;
    -- 4. Write what was decided: buckets and lines (none for a folded reservation), counters
    --    that differ from their row.
    IF taken > 0 THEN
        WITH taken_from AS (
            UPDATE inventory_buckets b
               SET available = b.available - t.q, reserved = b.reserved + t.q
              FROM unnest(b_id, b_took) AS t(bucket, q)
             WHERE b.deal_id = p_deal AND b.bucket = t.bucket AND t.q > 0
            RETURNING 1)
        SELECT count(*) INTO got FROM taken_from;
        ASSERT got = taken, 'every bucket taken from is locked by this transaction';
    END IF;
    IF cardinality(l_order) > 0 THEN
        INSERT INTO reservation_lines (order_id, deal_id, bucket, quantity)
        SELECT t.o, p_deal, t.b, t.q FROM unnest(l_order, l_bucket, l_units) AS t(o, b, q);
    END IF;
    FOR u IN 1..cardinality(users) LOOP
        IF created[u] AND held[u] = 0 THEN
            emptied := emptied + 1;
        ELSIF held[u] <> stored[u] THEN
            changed := changed + 1;
        END IF;
    END LOOP;
    IF changed > 0 THEN
        UPDATE user_deal_units c SET units = t.now, limit_units = p_limit
          FROM unnest(users, held, stored, created) AS t(u, now, was, made)
         WHERE c.deal_id = p_deal AND c.user_id = t.u AND t.now <> t.was
           AND NOT (t.made AND t.now = 0) AND t.now <= p_limit;
        GET DIAGNOSTICS got = ROW_COUNT;
        ASSERT got = changed,
            'every counter changed is locked by this transaction and within the limit';
    END IF;
    -- A refused request leaves nothing behind, not even an empty counter.
    IF emptied > 0 THEN
        DELETE FROM user_deal_units c
         USING unnest(users, held, created) AS t(u, now, made)
         WHERE c.deal_id = p_deal AND c.user_id = t.u AND t.made AND t.now = 0;
        GET DIAGNOSTICS got = ROW_COUNT;
        ASSERT got = emptied, 'every counter created and left empty is removed';
    END IF;
    -- 5. Ran out: nothing left here, and nothing anywhere else either.
    IF NOT stopped AND total = 0 THEN
        ran_out := NOT EXISTS (
            SELECT 1 FROM inventory_buckets b
             WHERE b.deal_id = p_deal AND b.available > 0 AND b.bucket <> ALL (b_id));
    END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION orders_place_batch(
    p_deal text, p_ids uuid[], p_users text[], p_keys text[], p_fps bytea[], p_units int[],
    p_after int[], p_share int[], p_wait_all boolean, p_hook text, p_hook_arg text,
    p_careful boolean)
RETURNS TABLE (n int, outcome text, available bigint, ran_out boolean, rechecked boolean,
               id uuid, user_id text, deal_id text, status text, quantity int,
               amount_minor bigint, currency text, expires_at timestamptz,
               created_at timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    requests int := coalesce(cardinality(p_ids), 0);
    d record;
    units int[] := p_units;
    outcomes text[] := array_fill(NULL::text, ARRAY[requests]);
    left_after bigint[] := array_fill(NULL::bigint, ARRAY[requests]);
    buckets int[];
    decided record;
    placed uuid[];
    ran boolean := false;
    careful boolean := p_careful;
    again boolean := false;
    attempts int := 0;
BEGIN
    SELECT x.unit_price_minor, x.currency, x.reservation_ttl_seconds, x.per_user_limit,
           x.name, x.late_payment_policy, x.capture_method,
           NOT x.paused AND (x.starts_at IS NULL OR x.starts_at <= now())
               AND (x.ends_at IS NULL OR now() < x.ends_at) AS open
      INTO d FROM deals x WHERE x.id = p_deal;
    IF FOUND AND d.open THEN
        LOOP
            BEGIN
                IF careful THEN
                    SELECT array_agg(CASE WHEN EXISTS (
                                SELECT 1 FROM orders x
                                 WHERE x.user_id = j.u AND x.idempotency_key = j.key)
                            THEN 0 ELSE j.q END ORDER BY j.k)
                      INTO units
                      FROM unnest(p_users, p_keys, p_units) WITH ORDINALITY AS j(u, key, q, k);
                END IF;
                decided := inventory_reserve_batch(p_deal, p_ids, p_users, units, p_after,
                                                   d.per_user_limit, p_share, p_wait_all,
                                                   NOT careful, true);
                outcomes := decided.outcomes;
                buckets := decided.buckets;
                -- A refused request whose key was placed before is a replay or a conflict,
                -- never a refusal. Read under the users' counter locks, which every order's
                -- insert holds, this sees every key placed so far.
                IF ('per_user_limit' = ANY (outcomes) OR 'sold_out' = ANY (outcomes)) AND EXISTS (
                    SELECT 1 FROM unnest(p_users, p_keys, outcomes) AS j(u, key, o)
                     WHERE j.o IN ('per_user_limit', 'sold_out')
                       AND EXISTS (SELECT 1 FROM orders x
                                    WHERE x.user_id = j.u AND x.idempotency_key = j.key)) THEN
                    RAISE unique_violation USING MESSAGE = 'a refused request''s key was placed';
                END IF;
                -- In (user, key) order, as every batch inserts.
                INSERT INTO orders (id, user_id, deal_id, idempotency_key, request_fingerprint,
                                    status, quantity, unit_price_minor, amount_minor, currency,
                                    expires_at, deal_name, late_payment_policy, capture_method,
                                    bucket)
                SELECT j.id, j.u, p_deal, j.key, j.fp, 'PENDING_PAYMENT', j.q,
                       d.unit_price_minor, d.unit_price_minor * j.q, d.currency,
                       now() + make_interval(secs => d.reservation_ttl_seconds),
                       d.name, d.late_payment_policy, d.capture_method, buckets[j.k]
                  FROM unnest(p_ids, p_users, p_keys, p_fps, p_units) WITH ORDINALITY
                       AS j(id, u, key, fp, q, k)
                 WHERE outcomes[j.k] = 'reserved'
                 ORDER BY j.u, j.key, j.k;
                EXIT;
            EXCEPTION WHEN unique_violation THEN
                -- A known buyer or key: decided again, the careful way. Each attempt after
                -- the first finds at least one more key placed, so the attempts are bounded.
                again := true;
                careful := true;
                attempts := attempts + 1;
                IF attempts > requests THEN
                    RAISE;
                END IF;
            END;
        END LOOP;
        left_after := decided.left_after;
        ran := decided.ran_out;
        IF p_hook IS NOT NULL AND 'reserved' = ANY (outcomes) THEN
            placed := ARRAY(SELECT p_ids[i] FROM generate_subscripts(outcomes, 1) AS i
                             WHERE outcomes[i] = 'reserved');
            EXECUTE format('SELECT %s($1, $2)', p_hook::regproc) USING placed, p_hook_arg;
        END IF;
    END IF;
    -- A reserved order is the row inserted above (same ids, same `now()`); any other
    -- answered request names an order placed before.
    RETURN QUERY
    SELECT t.k::int,
           CASE WHEN t.o IN ('reserved', 'per_user_limit', 'sold_out', 'undecided') THEN t.o
                WHEN o.id IS NULL THEN 'sale_not_open'
                WHEN o.request_fingerprint = p_fps[t.k] THEN 'replayed'
                ELSE 'idempotency_conflict' END,
           t.a, ran, again, o.id, o.user_id, o.deal_id, o.status, o.quantity, o.amount_minor,
           o.currency, o.expires_at, o.created_at
      FROM unnest(outcomes, left_after) WITH ORDINALITY AS t(o, a, k)
      LEFT JOIN LATERAL (
            SELECT p_ids[t.k] AS id, p_users[t.k] AS user_id, p_deal AS deal_id,
                   'PENDING_PAYMENT'::text AS status, p_units[t.k] AS quantity,
                   d.unit_price_minor * p_units[t.k] AS amount_minor, d.currency::text AS currency,
                   now() + make_interval(secs => d.reservation_ttl_seconds) AS expires_at,
                   now() AS created_at, p_fps[t.k] AS request_fingerprint
             WHERE t.o = 'reserved'
            UNION ALL
            SELECT x.id, x.user_id, x.deal_id, x.status, x.quantity, x.amount_minor,
                   x.currency, x.expires_at, x.created_at, x.request_fingerprint
              FROM orders x
             WHERE (t.o IS NULL OR t.o = 'skipped')
               AND x.user_id = p_users[t.k] AND x.idempotency_key = p_keys[t.k]) o ON true
     ORDER BY t.k;
END
$fn$;
