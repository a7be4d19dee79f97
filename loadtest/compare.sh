#!/usr/bin/env bash
# One run, one machine, side by side:
#   (a) the seed design: one hot stock row, one transaction per purchase (pgbench)
#   (b) the same spread over 32 bucket rows (pgbench)
#   (c) flashgate end to end: HTTP, auth, limits, reservation and order, durable
#   (d) flashgate rejecting a sold-out deal (wrk)
#   (e) a bare hyper server answering a tiny JSON body (wrk)
# and the ratios (c)/(a), (c)/(b), (d)/(e). Writes the tables into docs/PERFORMANCE.md
# between the COMPARISON markers. Loopback only; every step is bounded in time.
#
# Usage: loadtest/compare.sh [seconds per measurement, default 10]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SECONDS_EACH=${1:-10}
CLIENTS=64
BASE_URL_DB=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
DB_PREFIX=${BASE_URL_DB%/*}
RUN_ID=$(date +%s)
# `serve` refuses secrets left at their development defaults or shorter than 32 bytes; the
# sale client reads the same two variables.
export FLASHGATE_JWT_SECRET="compare-jwt-secret-$RUN_ID-$(od -An -N16 -tx1 /dev/urandom | tr -d " \n")"
export FLASHGATE_ADMIN_TOKEN="compare-admin-token-$RUN_ID-$(od -An -N16 -tx1 /dev/urandom | tr -d " \n")"
export FLASHGATE__WAITING_ROOM__PASS_SECRET="compare-pass-secret-$RUN_ID-$(od -An -N16 -tx1 /dev/urandom | tr -d " \n")"
WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

log() { printf 'compare: %s\n' "$*" >&2; }

bash scripts/services.sh
if ! command -v wrk >/dev/null; then
    log "installing wrk"
    apt-get update -qq && apt-get install -y -qq wrk >/dev/null
fi
command -v pgbench >/dev/null || { log "pgbench is missing (Debian package postgresql-client)"; exit 1; }

log "building release binaries"
cargo build --release -q -p flashgate -p flashgate-loadtest

psql_base() { psql "$BASE_URL_DB" -qAt "$@"; }
fresh_db() {
    local name="fg_cmp_${1}_${RUN_ID}"
    psql_base -c "DROP DATABASE IF EXISTS $name WITH (FORCE)" -c "CREATE DATABASE $name" >/dev/null
    echo "$DB_PREFIX/$name"
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# --- (a) and (b): pgbench ------------------------------------------------------------
PGB_URL=$(fresh_db pgbench)
psql "$PGB_URL" -q <<'SQL'
CREATE TABLE stock (id int PRIMARY KEY, available bigint NOT NULL CHECK (available >= 0));
CREATE TABLE seed_orders (id bigserial PRIMARY KEY, stock_id int NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
INSERT INTO stock SELECT g, 100000000 FROM generate_series(1, 32) g;
SQL
cat > "$WORK/hot.sql" <<'SQL'
BEGIN;
UPDATE stock SET available = available - 1 WHERE id = 1 AND available >= 1;
INSERT INTO seed_orders (stock_id) VALUES (1);
COMMIT;
SQL
cat > "$WORK/buckets.sql" <<'SQL'
\set b random(1, 32)
BEGIN;
UPDATE stock SET available = available - 1 WHERE id = :b AND available >= 1;
INSERT INTO seed_orders (stock_id) VALUES (:b);
COMMIT;
SQL
pgbench_tps() {
    pgbench -n -c "$CLIENTS" -j 2 -T "$SECONDS_EACH" -f "$1" "$PGB_URL" 2>/dev/null \
        | awk '/^tps = / {print $3; exit}'
}
log "(a) one hot row, $CLIENTS clients, ${SECONDS_EACH}s"
A=$(pgbench_tps "$WORK/hot.sql")
log "(b) 32 bucket rows, $CLIENTS clients, ${SECONDS_EACH}s"
B=$(pgbench_tps "$WORK/buckets.sql")

# --- (c): flashgate end to end ------------------------------------------------------
GW_URL=$(fresh_db gateway)
GW_PORT=$(free_port)
OPS_PORT=$(free_port)
DATABASE_URL=$GW_URL FLASHGATE_LISTEN=127.0.0.1:$GW_PORT FLASHGATE_OPS_LISTEN=127.0.0.1:$OPS_PORT RUST_LOG=warn \
FLASHGATE__REDIS__KEY_PREFIX="cmp${RUN_ID}:" \
FLASHGATE__LIMITS__PER_IP__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_IP__BURST=1000000 \
FLASHGATE__LIMITS__PER_USER__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_USER__BURST=1000000 \
FLASHGATE__LIMITS__PER_DEAL__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_DEAL__BURST=1000000 \
    target/release/flashgate serve >"$WORK/gateway.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$GW_PORT/healthz" >/dev/null && break; sleep 0.1; done
log "(c) flashgate purchases, $CLIENTS in flight, ${SECONDS_EACH}s"
target/release/flashgate-loadtest sale --base-url "http://127.0.0.1:$GW_PORT" --ops-url "http://127.0.0.1:$OPS_PORT" \
    --stock 10000000 --buckets 32 --users 1000000 --per-user-limit 1 --concurrency "$CLIENTS" \
    --duration-max-seconds "$SECONDS_EACH" --database-url "$GW_URL" \
    --out "$WORK/sale.json" >"$WORK/sale.txt"
C=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(round(r["verdict"]["created"]/r["elapsed_seconds"],1))' "$WORK/sale.json")
C_P99=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(round(r["latency_by_outcome"]["201"]["p99_us"]/1000,1))' "$WORK/sale.json")

# --- a whole sale to sell-out, charted -----------------------------------------------
log "a sale to sell-out: 20000 units, 40000 users, $CLIENTS in flight (chart: docs/sale.svg)"
target/release/flashgate-loadtest sale --base-url "http://127.0.0.1:$GW_PORT" --ops-url "http://127.0.0.1:$OPS_PORT" \
    --stock 20000 --buckets 32 --users 40000 --per-user-limit 1 --concurrency "$CLIENTS" \
    --duration-max-seconds 60 --database-url "$GW_URL" \
    --out "$WORK/sellout.json" --chart docs/sale.svg >"$WORK/sellout.txt"
SELLOUT=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); v=r["verdict"]; print("%d orders for 20000 units, sold out after %s s, %.0f requests/s, verdict ok=%s" % (v["created"], r["sold_out_after_seconds"], r["requests_per_second"], v["ok"]))' "$WORK/sellout.json")

# --- (d): flashgate rejecting a sold-out deal ---------------------------------------
curl -sf -X POST "http://127.0.0.1:$OPS_PORT/admin/deals" -H 'Authorization: Bearer flashgate-dev-admin-token' \
    -d '{"id":"sold-out","name":"Sold out","stock":0,"buckets":1,"unit_price_minor":100,"currency":"EUR","per_user_limit":1,"reservation_ttl_seconds":60}' >/dev/null
TOKEN=$(target/release/flashgate token --user wrk-user)
cat > "$WORK/soldout.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"quantity":1}'
wrk.headers["Authorization"] = "Bearer $TOKEN"
wrk.headers["Idempotency-Key"] = "wrk-key"
LUA
wrk_rps() { wrk -t2 -c"$CLIENTS" -d"${SECONDS_EACH}s" "$@" | awk '/^Requests\/sec:/ {print $2}'; }
log "(d) sold-out rejections, $CLIENTS connections, ${SECONDS_EACH}s"
D=$(wrk_rps -s "$WORK/soldout.lua" "http://127.0.0.1:$GW_PORT/v1/deals/sold-out/orders")
STATUS=$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$GW_PORT/v1/deals/sold-out/orders" \
    -H "Authorization: Bearer $TOKEN" -H 'Idempotency-Key: check' -d '{"quantity":1}')
[ "$STATUS" = 409 ] || { log "the sold-out deal answered $STATUS, not 409"; exit 1; }

# --- (e): bare hyper server ---------------------------------------------------------
BARE_PORT=$(free_port)
target/release/flashgate-loadtest bare-server --listen "127.0.0.1:$BARE_PORT" >"$WORK/bare.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$BARE_PORT/" >/dev/null && break; sleep 0.1; done
log "(e) bare hyper server, $CLIENTS connections, ${SECONDS_EACH}s"
E=$(wrk_rps "http://127.0.0.1:$BARE_PORT/")

ratio() { python3 -c "print(f'{float($1)/float($2):.2f}')"; }
CA=$(ratio "$C" "$A"); CB=$(ratio "$C" "$B"); DE=$(ratio "$D" "$E")
MACHINE="$(nproc) CPUs ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), $(free -g | awk '/Mem:/ {print $2}') GiB, $(psql_base -c 'SHOW server_version' | cut -d' ' -f1 | sed 's/^/PostgreSQL /'), synchronous_commit $(psql_base -c 'SHOW synchronous_commit')"
TABLE=$(cat <<MD
Measured $(date -u +%Y-%m-%d) by \`loadtest/compare.sh $SECONDS_EACH\` on $MACHINE; load generator,
gateway and PostgreSQL share the machine. $CLIENTS clients or connections, ${SECONDS_EACH} s each.

| | what | throughput |
|---|---|---|
| (a) | seed design, one hot row (pgbench) | $A purchases/s |
| (b) | seed design over 32 bucket rows (pgbench) | $B purchases/s |
| (c) | flashgate end to end (HTTP, JWT, limits, reservation, order; durable) | $C purchases/s (p99 ${C_P99} ms) |
| (d) | flashgate rejecting a sold-out deal (wrk) | $D requests/s |
| (e) | bare hyper server, tiny JSON (wrk) | $E requests/s |

A whole sale (20,000 units, 40,000 users, one attempt each): $SELLOUT. Throughput,
p50/p99 latency and remaining stock over time: [sale.svg](sale.svg).

| ratio | value |
|---|---|
| (c) / (a): flashgate against the hot row | $CA |
| (c) / (b): flashgate against plain buckets | $CB |
| (d) / (e): sold-out rejection against a bare server | $DE |
MD
)
echo "$TABLE"
python3 - "$TABLE" <<'PY'
import re, sys
path = "docs/PERFORMANCE.md"
text = open(path).read()
block = "<!-- COMPARISON:BEGIN -->\n" + sys.argv[1] + "\n<!-- COMPARISON:END -->"
if "<!-- COMPARISON:BEGIN -->" in text:
    text = re.sub(r"<!-- COMPARISON:BEGIN -->.*?<!-- COMPARISON:END -->", lambda _: block, text, flags=re.S)
else:
    text += "\n## Side by side: `loadtest/compare.sh`\n\n" + block + "\n"
open(path, "w").write(text)
PY
log "docs/PERFORMANCE.md updated"
