-- orders_place_batch: the current definition. PostgreSQL runs exactly this text after every
-- migration (tests/api/sql_functions.rs); to change it, see sql/README.md.
--
-- The orders' half of the reservation engine, and its entry point (`src/orders/batch.rs`):
-- a batch of orders for one deal is decided and committed in one statement, one round trip
-- and one short transaction. It owns the order rows and idempotency, and calls
-- `inventory_reserve_batch` for the units.
--
-- Places requests 1..n for one deal: lets inventory decide, inserts the orders it reserved
-- (an order that took a single bucket keeps it in `bucket`, in place of a reservation line),
-- runs the caller's hook (`p_hook`, by name: payments opens the first attempt, so orders does
-- not depend on payments) for the orders placed, and answers every request: reserved,
-- replayed, idempotency_conflict, sale_not_open, per_user_limit, sold_out, undecided (run
-- again with `p_wait_all`). `p_after[k]` is the previous request of the batch with the same
-- user and key, or 0. A refused request writes nothing.
--
-- Lock order: inventory locks the users' counters first, and an order is only ever inserted
-- by a transaction holding its user's counter in that deal, so two batches of one deal
-- never wait on each other's key while holding buckets. A key its user reuses in another
-- deal can make a batch wait for the other's commit; as every batch inserts its orders in
-- (user, key) order, no two wait on each other.
--
-- Nearly every request is a new key from a new buyer, so unless told to be careful
-- (`p_careful`) every request is asked and the counters and orders are inserted plainly; a
-- known counter or key raises `unique_violation`, which undoes that attempt alone, and the
-- batch is decided again the careful way: keys placed before are not asked (their requests
-- are answered from the order placed), and a key placed by another batch since it was read
-- undoes the attempt again. `rechecked` reports a batch decided again, so the gateway can
-- send the deal's next few batches the careful way at once. The deal's snapshot (name,
-- late-payment policy, capture method) is written by the insert itself, so the
-- `orders_snapshot_deal` trigger does not run.
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
