#!/usr/bin/env bash
# What one reservation batch costs PostgreSQL, without the gateway: pgbench calls
# `orders_place_batch` with N new users per call (one unit each, per-user limit 1), one
# client per lane, each client on its lane's share of 32 buckets as the gateway's lanes
# are. For each batch size it prints the CPU time of the backends per purchase (from
# /proc, over the run minus its first and last second) and the WAL written per purchase.
# The schema is the one `flashgate migrate` applies, on a fresh database dropped at the end.
# With PAYMENTS=1 each placed order also gets its first payment attempt in the same
# statement, as when the gateway has a payment provider configured. With CAREFUL=1 every
# batch checks its keys and buyers with `ON CONFLICT` from the start, as the gateway's
# batches do for a while after one met a known key or buyer, instead of inserting them
# plainly. With EVENTS=0 the order events' insert trigger is disabled, to see what writing the
# events costs a purchase (compare with a run without it, the same minute). COST_BIN
# names the binary that migrates the scratch database (default target/release/flashgate,
# built when missing).
#
# Usage: [PAYMENTS=1] [CAREFUL=1] [EVENTS=0] [LANES=n] loadtest/batch_cost.sh [seconds per size, default 10] [batch sizes, default "1 8 24 64"]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SECONDS_EACH=${1:-10}
SIZES=${2:-1 8 24 64}
# One client per lane, as many lanes as the gateway chooses on this machine when
# `orders.lanes` is 0 (two a core, between 4 and 16); LANES=n measures another count.
LANES=${LANES:-$(( $(nproc) * 2 < 4 ? 4 : ($(nproc) * 2 > 16 ? 16 : $(nproc) * 2) ))}
if [ "${PAYMENTS:-0}" = 1 ]; then
    HOOK="'payments_open_initial_attempts', 'fake'"
else
    HOOK="NULL, NULL"
fi
if [ "${CAREFUL:-0}" = 1 ]; then CAREFUL=true; else CAREFUL=false; fi
BASE_URL_DB=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
NAME="fg_batch_cost_$(date +%s)"
DB="${BASE_URL_DB%/*}/$NAME"
WORK=$(mktemp -d)
cleanup() {
    psql "$BASE_URL_DB" -qc "DROP DATABASE IF EXISTS $NAME WITH (FORCE)" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

[ "$SECONDS_EACH" -ge 4 ] || { echo "batch_cost: at least 4 seconds per size" >&2; exit 64; }
psql "$BASE_URL_DB" -qc "CREATE DATABASE $NAME"
BIN=${COST_BIN:-target/release/flashgate}
[ -x "$BIN" ] || cargo build --release -q --bin flashgate
DATABASE_URL=$DB "$BIN" migrate >/dev/null
if [ "${EVENTS:-1}" = 0 ]; then
    psql "$DB" -qc "ALTER TABLE orders DISABLE TRIGGER events_orders_inserted"
fi
psql "$DB" -q <<'SQL'
INSERT INTO deals (id, name, stock_total, bucket_count, unit_price_minor, currency,
                   per_user_limit, reservation_ttl_seconds)
VALUES ('cost', 'Batch cost', 1000000000, 32, 100, 'EUR', 1, 600);
INSERT INTO inventory_buckets (deal_id, bucket, available)
SELECT 'cost', b, 1000000000 / 32 FROM generate_series(0, 31) b;
-- Time-ordered ids, as the gateway's UUIDv7 order ids are.
CREATE FUNCTION cost_order_id() RETURNS uuid LANGUAGE sql VOLATILE AS $$
    SELECT (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')
            || '7' || substr(md5(random()::text), 1, 19))::uuid $$;
SQL

ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
backend_ticks() {
    local total=0 pid
    for pid in $1; do total=$((total + $(ticks "$pid"))); done
    echo "$total"
}
CLK_TCK=$(getconf CLK_TCK)
printf '%6s %12s %14s %22s %16s\n' batch batches/s purchases/s "backend CPU/purchase" "WAL/purchase"
for n in $SIZES; do
    cat >"$WORK/batch.sql" <<SQL
\\set lane :client_id % $LANES
SELECT count(*) FROM orders_place_batch('cost',
    (SELECT array_agg(cost_order_id()) FROM generate_series(1, $n)),
    (SELECT array_agg('u' || md5(random()::text)) FROM generate_series(1, $n)),
    array_fill('k'::text, ARRAY[$n]), array_fill('\\x7631'::bytea, ARRAY[$n]),
    array_fill(1, ARRAY[$n]), array_fill(0, ARRAY[$n]),
    (SELECT array_agg(b) FROM generate_series(0, 31) b WHERE b % $LANES = :lane),
    false, $HOOK, $CAREFUL);
SQL
    lsn_before=$(psql "$DB" -Atc "SELECT pg_current_wal_lsn()")
    pgbench -n -M prepared -c "$LANES" -j 2 -T "$SECONDS_EACH" -f "$WORK/batch.sql" \
        "$DB?sslmode=disable" >"$WORK/pgbench.out" 2>&1 &
    bench=$!
    sleep 1
    pids=$(psql "$DB" -Atc "SELECT pid FROM pg_stat_activity
                             WHERE datname = current_database() AND pid <> pg_backend_pid()")
    before=$(backend_ticks "$pids")
    sleep $((SECONDS_EACH - 2))
    after=$(backend_ticks "$pids")
    wait "$bench"
    lsn_after=$(psql "$DB" -Atc "SELECT pg_current_wal_lsn()")
    tps=$(awk '/^tps = / {print $3; exit}' "$WORK/pgbench.out")
    wal=$(psql "$DB" -Atc "SELECT pg_wal_lsn_diff('$lsn_after', '$lsn_before')")
    python3 -c "
n, tps, ticks, clk, window, secs, wal = $n, $tps, $((after - before)), $CLK_TCK, $((SECONDS_EACH - 2)), $SECONDS_EACH, $wal
purchases = tps * n
print(f'{n:6d} {tps:12.0f} {purchases:14.0f} {ticks / clk / window / purchases * 1e6:19.0f} µs {wal / (tps * secs * n):14.0f} B')"
done
