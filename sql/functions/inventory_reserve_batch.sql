-- inventory_reserve_batch: the current definition. PostgreSQL runs exactly this text after
-- every migration (tests/api/sql_functions.rs); to change it, see sql/README.md.
--
-- Inventory's half of the reservation engine: it owns the bucket rows, the per-user counters
-- and the reservation lines. `orders_place_batch` calls it for a batch of requests of one
-- deal (and `src/inventory` for a single request).
--
-- Reserves units for requests 1..n of one deal, each decided exactly as if it had run alone,
-- in arrival order; one request's refusal never fails the others. A request with
-- `p_units[k] = 0` is not asked (its outcome is NULL). `p_after[k]`, when not 0, is an
-- earlier request of the same idempotency key: request k is then `skipped` if that one (or
-- its own predecessor) was reserved. `p_share` is the lane's own buckets, locked first
-- without waiting; more are taken, also without waiting, only when they cannot serve a
-- request. When a request could only be decided by waiting for a bucket another transaction
-- holds, it and every later request are `undecided` (nothing of theirs is written): the
-- caller runs them again with `p_wait_all`, which locks every non-empty bucket in ascending
-- order and always decides. `p_new_users` says the caller expects every user to be new: the
-- counters are then inserted plainly, and an existing one raises `unique_violation`.
-- `p_fold` lets the caller keep the reservation of an order that took a single bucket in the
-- order's own row (`orders.bucket`, one row fewer per purchase): such a request's bucket is
-- answered in `buckets[k]` and no line is written for it; every other reservation is kept
-- as reservation lines.
--
-- Answers: `outcomes[k]` (reserved, per_user_limit, sold_out, skipped, undecided),
-- `left_after[k]` (what was left after request k, exact for sold_out), `buckets[k]` (see
-- `p_fold`) and `ran_out` (the deal has no unit left anywhere).
--
-- Lock order: counters (by user), then buckets ascending; a bucket taken out of that order
-- is only ever taken with SKIP LOCKED, so no transaction waits while holding a bucket out of
-- order and nothing deadlocks. The planner settings keep its statements on index lookups
-- whatever the statistics say: a generic plan chosen while the tables are small would
-- otherwise stay cached as they grow.
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
