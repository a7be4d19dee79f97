-- The reservation engine: a batch of orders for one deal is decided and committed in one
-- statement (one round trip, one implicit transaction). Two functions, one per owner:
-- `inventory_reserve_batch` owns the bucket rows, the per-user counters and the reservation
-- lines; `orders_place_batch` owns the order rows and idempotency and calls the first.
-- Each request is decided exactly as if it had run alone, in arrival order, and one
-- request's refusal never fails the others. Lock order everywhere: counters (by user), then
-- buckets ascending; buckets taken out of that order are only ever taken with SKIP LOCKED,
-- so no transaction waits while holding a bucket out of order and nothing deadlocks.

-- Lines are written by inventory in the same statement as their order row (which orders
-- may insert after inventory decided); the reference is checked at commit.
ALTER TABLE reservation_lines
    ALTER CONSTRAINT reservation_lines_order_id_fkey DEFERRABLE INITIALLY DEFERRED;

-- Reserves units for requests 1..n of one deal. A request with `p_units[k] = 0` is not
-- asked (its outcome is NULL). `p_after[k]`, when not 0, is an earlier request of the same
-- idempotency key: request k is then `skipped` if that one (or its own predecessor) was
-- reserved. `p_share` is the lane's own buckets, locked first without waiting; more are
-- taken, also without waiting, only when they cannot serve a request. When a request could
-- only be decided by waiting for a bucket another transaction holds, it and every later
-- request are `undecided` (nothing of theirs is written): the caller runs them again with
-- `p_wait_all`, which locks every non-empty bucket in ascending order and always decides.
-- Outcomes: reserved, per_user_limit, sold_out, skipped, undecided. `available` is what
-- was left after the request (exact for sold_out); `ran_out` says the deal has no unit left.
CREATE FUNCTION inventory_reserve_batch(
    p_deal text, p_orders uuid[], p_users text[], p_units int[], p_after int[],
    p_limit int, p_share int[], p_wait_all boolean)
RETURNS TABLE (n int, outcome text, available bigint, ran_out boolean)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    requests int := coalesce(cardinality(p_orders), 0);
    users text[];
    held int[];
    created boolean[];
    held_before int[];
    b_id int[];
    b_av bigint[];
    b_took bigint[];
    total bigint;
    outcomes text[] := array_fill(NULL::text, ARRAY[requests]);
    left_after bigint[] := array_fill(NULL::bigint, ARRAY[requests]);
    l_order uuid[] := '{}';
    l_bucket int[] := '{}';
    l_units int[] := '{}';
    stopped boolean := false;
    ran boolean := false;
    k int; u int; q int; i int; j int; got int; prev int;
    want bigint; take bigint;
    more record;
BEGIN
    ASSERT cardinality(p_users) = requests AND cardinality(p_units) = requests
       AND cardinality(p_after) = requests, 'one entry per request in every array';
    -- 1. Counters, in user order: a missing row is created, an existing one locked.
    WITH asked AS (
        SELECT DISTINCT t.u FROM unnest(p_users, p_units) AS t(u, q) WHERE t.q > 0),
    locked AS (
        INSERT INTO user_deal_units AS c (deal_id, user_id, units, limit_units)
        SELECT p_deal, a.u, 0, p_limit FROM asked a ORDER BY a.u
        ON CONFLICT (deal_id, user_id) DO UPDATE SET units = c.units
        RETURNING c.user_id, c.units, c.xmax = 0 AS created)
    SELECT array_agg(l.user_id ORDER BY l.user_id), array_agg(l.units ORDER BY l.user_id),
           array_agg(l.created ORDER BY l.user_id)
      INTO users, held, created FROM locked l;
    IF users IS NULL THEN
        RETURN QUERY SELECT t.k::int, NULL::text, NULL::bigint, false
                       FROM generate_series(1, requests) AS t(k);
        RETURN;
    END IF;
    held_before := held;
    -- 2. Buckets: the lane's share without waiting, or every non-empty one, waiting.
    IF p_wait_all THEN
        SELECT array_agg(s.bucket ORDER BY s.bucket), array_agg(s.available ORDER BY s.bucket)
          INTO b_id, b_av
          FROM (SELECT b.bucket, b.available FROM inventory_buckets b
                 WHERE b.deal_id = p_deal AND b.available > 0
                 ORDER BY b.bucket FOR NO KEY UPDATE) s;
    ELSE
        SELECT array_agg(s.bucket ORDER BY s.bucket), array_agg(s.available ORDER BY s.bucket)
          INTO b_id, b_av
          FROM (SELECT b.bucket, b.available FROM inventory_buckets b
                 WHERE b.deal_id = p_deal AND b.available > 0 AND b.bucket = ANY (p_share)
                 ORDER BY b.bucket FOR NO KEY UPDATE SKIP LOCKED) s;
    END IF;
    b_id := coalesce(b_id, '{}');
    b_av := coalesce(b_av, '{}');
    b_took := array_fill(0::bigint, ARRAY[cardinality(b_id)]);
    total := coalesce((SELECT sum(x) FROM unnest(b_av) AS x), 0);
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
            b_av[i] := b_av[i] - take;
            b_took[i] := b_took[i] + take;
            l_order := l_order || p_orders[k];
            l_bucket := l_bucket || b_id[i];
            l_units := l_units || take::int;
            want := want - take;
        END LOOP;
        held[u] := held[u] + q;
        total := total - q;
        outcomes[k] := 'reserved';
        left_after[k] := total;
    END LOOP;
    -- 4. Write what was decided: buckets, counters, lines.
    UPDATE inventory_buckets b
       SET available = b.available - t.q, reserved = b.reserved + t.q
      FROM unnest(b_id, b_took) AS t(bucket, q)
     WHERE b.deal_id = p_deal AND b.bucket = t.bucket AND t.q > 0;
    GET DIAGNOSTICS got = ROW_COUNT;
    ASSERT got = (SELECT count(*) FROM unnest(b_took) AS x WHERE x > 0),
        'every bucket taken from is locked by this transaction';
    UPDATE user_deal_units c SET units = t.now, limit_units = p_limit
      FROM unnest(users, held, held_before) AS t(u, now, was)
     WHERE c.deal_id = p_deal AND c.user_id = t.u AND t.now > t.was AND t.now <= p_limit;
    GET DIAGNOSTICS got = ROW_COUNT;
    ASSERT got = (SELECT count(*) FROM unnest(held, held_before) AS t(now, was) WHERE t.now > t.was),
        'every counter raised is locked by this transaction and within the limit';
    INSERT INTO reservation_lines (order_id, deal_id, bucket, quantity)
    SELECT t.o, p_deal, t.b, t.q FROM unnest(l_order, l_bucket, l_units) AS t(o, b, q);
    -- A refused request leaves nothing behind, not even an empty counter.
    DELETE FROM user_deal_units c
     USING unnest(users, held, created) AS t(u, now, created)
     WHERE c.deal_id = p_deal AND c.user_id = t.u AND t.created AND t.now = 0;
    -- 5. Ran out: nothing left here, and nothing anywhere else either.
    IF NOT stopped AND total = 0 THEN
        ran := NOT EXISTS (SELECT 1 FROM inventory_buckets b
                            WHERE b.deal_id = p_deal AND b.available > 0 AND b.bucket <> ALL (b_id));
    END IF;
    RETURN QUERY SELECT t.k::int, t.o, t.a, ran
                   FROM unnest(outcomes, left_after) WITH ORDINALITY AS t(o, a, k);
END
$fn$;

-- Places requests 1..n for one deal: inserts their orders (a key used before inserts
-- nothing), lets inventory decide, removes the orders it refused, runs the caller's hook
-- (payments opens the first attempt) for the orders placed, and answers every request:
-- reserved, replayed, idempotency_conflict, sale_not_open, per_user_limit, sold_out,
-- undecided (run again with p_wait_all). `p_after[k]` is the previous request of the batch
-- with the same user and key, or 0.
CREATE FUNCTION orders_place_batch(
    p_deal text, p_ids uuid[], p_users text[], p_keys text[], p_fps bytea[], p_units int[],
    p_after int[], p_share int[], p_wait_all boolean, p_hook text, p_hook_arg text)
RETURNS TABLE (n int, outcome text, available bigint, ran_out boolean,
               id uuid, user_id text, deal_id text, status text, quantity int,
               amount_minor bigint, currency text, expires_at timestamptz,
               created_at timestamptz)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    requests int := coalesce(cardinality(p_ids), 0);
    d record;
    inserted uuid[] := '{}';
    units int[] := array_fill(0, ARRAY[requests]);
    outcomes text[] := array_fill(NULL::text, ARRAY[requests]);
    left_after bigint[] := array_fill(NULL::bigint, ARRAY[requests]);
    refused uuid[];
    late uuid[];
    placed uuid[];
    ran boolean := false;
    r record;
    k int;
BEGIN
    SELECT x.unit_price_minor, x.currency, x.reservation_ttl_seconds, x.per_user_limit,
           NOT x.paused AND (x.starts_at IS NULL OR x.starts_at <= now())
               AND (x.ends_at IS NULL OR now() < x.ends_at) AS open
      INTO d FROM deals x WHERE x.id = p_deal;
    IF FOUND AND d.open THEN
        -- In (user, key) order, so two batches sharing keys cannot wait on each other.
        WITH ins AS (
            INSERT INTO orders (id, user_id, deal_id, idempotency_key, request_fingerprint,
                                status, quantity, unit_price_minor, amount_minor, currency,
                                expires_at)
            SELECT j.id, j.u, p_deal, j.key, j.fp, 'PENDING_PAYMENT', j.q, d.unit_price_minor,
                   d.unit_price_minor * j.q, d.currency,
                   now() + make_interval(secs => d.reservation_ttl_seconds)
              FROM unnest(p_ids, p_users, p_keys, p_fps, p_units) WITH ORDINALITY
                   AS j(id, u, key, fp, q, k)
             ORDER BY j.u, j.key, j.k
            ON CONFLICT (user_id, idempotency_key) DO NOTHING
            RETURNING id)
        SELECT coalesce(array_agg(ins.id), '{}') INTO inserted FROM ins;
        -- Asked of inventory: every inserted order, and a repeated key whose first request
        -- inserted (it is skipped if that one reserves, decided afresh if not).
        FOR k IN 1..requests LOOP
            IF p_ids[k] = ANY (inserted) OR (p_after[k] > 0 AND units[p_after[k]] > 0) THEN
                units[k] := p_units[k];
            END IF;
        END LOOP;
        FOR r IN SELECT * FROM inventory_reserve_batch(p_deal, p_ids, p_users, units, p_after,
                                                       d.per_user_limit, p_share, p_wait_all)
        LOOP
            outcomes[r.n] := r.outcome;
            left_after[r.n] := r.available;
            ran := ran OR r.ran_out;
        END LOOP;
        SELECT array_agg(p_ids[t.k]) FILTER (WHERE t.o <> 'reserved' AND p_ids[t.k] = ANY (inserted)),
               array_agg(p_ids[t.k]) FILTER (WHERE t.o = 'reserved' AND NOT p_ids[t.k] = ANY (inserted)),
               array_agg(p_ids[t.k]) FILTER (WHERE t.o = 'reserved')
          INTO refused, late, placed
          FROM unnest(outcomes) WITH ORDINALITY AS t(o, k);
        IF refused IS NOT NULL THEN
            DELETE FROM orders o WHERE o.id = ANY (refused);
        END IF;
        IF late IS NOT NULL THEN
            -- A repeated key whose first request was refused, reserved on its own turn.
            INSERT INTO orders (id, user_id, deal_id, idempotency_key, request_fingerprint,
                                status, quantity, unit_price_minor, amount_minor, currency,
                                expires_at)
            SELECT j.id, j.u, p_deal, j.key, j.fp, 'PENDING_PAYMENT', j.q, d.unit_price_minor,
                   d.unit_price_minor * j.q, d.currency,
                   now() + make_interval(secs => d.reservation_ttl_seconds)
              FROM unnest(p_ids, p_users, p_keys, p_fps, p_units) AS j(id, u, key, fp, q)
             WHERE j.id = ANY (late);
        END IF;
        IF placed IS NOT NULL AND p_hook IS NOT NULL THEN
            EXECUTE format('SELECT %s($1, $2)', p_hook::regproc) USING placed, p_hook_arg;
        END IF;
    END IF;
    RETURN QUERY
    SELECT t.k::int,
           CASE WHEN t.o IN ('reserved', 'per_user_limit', 'sold_out', 'undecided') THEN t.o
                WHEN o.id IS NULL THEN 'sale_not_open'
                WHEN o.request_fingerprint = p_fps[t.k] THEN 'replayed'
                ELSE 'idempotency_conflict' END,
           t.a, ran, o.id, o.user_id, o.deal_id, o.status, o.quantity, o.amount_minor,
           o.currency, o.expires_at, o.created_at
      FROM unnest(outcomes, left_after) WITH ORDINALITY AS t(o, a, k)
      LEFT JOIN LATERAL (
            SELECT x.* FROM orders x
             WHERE x.user_id = p_users[t.k] AND x.idempotency_key = p_keys[t.k]
               AND (t.o IS NULL OR t.o IN ('reserved', 'skipped'))) o ON true
     ORDER BY t.k;
END
$fn$;
