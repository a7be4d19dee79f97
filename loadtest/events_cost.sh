#!/usr/bin/env bash
# What order events cost a sale, measured side by side in one run: one gateway with the
# shipped config/default.toml, and alternating 100,000-unit sales (200,000 users, 64 in
# flight): one with no event endpoint, one with a receiver inside the load tester (on a
# thread of its own) subscribed to every event (`flashgate-loadtest sale --events-receiver`),
# which answers at once. For each pair it prints purchases/s (orders created per second until
# sold out) of both and their ratio, how many events were delivered while the sale ran, and,
# for the subscribed sale, the rate the sale's whole backlog drained at when replayed to the
# receiver after the sale, with the check that every order's events arrived in sequence; then
# the medians and the ranges. The rate limits are lifted (the buyers share one address) and
# private targets are allowed (the receiver is on loopback); nothing else is changed.
# Loopback only; every sale is bounded in time.
#
# Usage: loadtest/events_cost.sh [--bin DIR] [pairs, default 3]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BIN=target/release
if [ "${1:-}" = --bin ]; then
    BIN=${2:?--bin needs a directory}
    shift 2
fi
PAIRS=${1:-3}
BASE_URL_DB=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
RUN_ID=$(date +%s)
DB_NAME="fg_events_cost_$RUN_ID"
DB_URL="${BASE_URL_DB%/*}/$DB_NAME"
secret() { echo "events-cost-$1-$RUN_ID-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"; }
export FLASHGATE_JWT_SECRET=$(secret jwt)
export FLASHGATE_ADMIN_TOKEN=$(secret admin)
export FLASHGATE__WAITING_ROOM__PASS_SECRET=$(secret pass)
WORK=$(mktemp -d)
GW_PID=
log() { printf 'events-cost: %s\n' "$*" >&2; }
psql_base() { psql "$BASE_URL_DB" -qAt "$@"; }
cleanup() {
    [ -n "$GW_PID" ] && kill "$GW_PID" 2>/dev/null
    rm -rf "$WORK"
    psql_base -c "DROP DATABASE IF EXISTS $DB_NAME WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT

bash scripts/services.sh
for binary in flashgate flashgate-loadtest; do
    [ -x "$BIN/$binary" ] || { log "$BIN/$binary is missing (cargo build --release -p flashgate -p flashgate-loadtest)"; exit 1; }
done
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
psql_base -c "CREATE DATABASE $DB_NAME" >/dev/null
GW_PORT=$(free_port)
OPS_PORT=$(free_port)
DATABASE_URL=$DB_URL FLASHGATE_LISTEN=127.0.0.1:$GW_PORT FLASHGATE_OPS_LISTEN=127.0.0.1:$OPS_PORT RUST_LOG=warn \
FLASHGATE__REDIS__KEY_PREFIX="evcost${RUN_ID}:" FLASHGATE__EVENTS__ALLOW_PRIVATE_TARGETS=true \
FLASHGATE__LIMITS__PER_IP__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_IP__BURST=1000000 \
FLASHGATE__LIMITS__PER_USER__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_USER__BURST=1000000 \
FLASHGATE__LIMITS__PER_DEAL__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_DEAL__BURST=1000000 \
    "$BIN/flashgate" serve >"$WORK/gateway.log" 2>&1 &
GW_PID=$!
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$GW_PORT/healthz" >/dev/null && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$GW_PORT/healthz" >/dev/null || { log "the gateway did not start"; cat "$WORK/gateway.log" >&2; exit 1; }

# One sale; $1 names its report, the rest are extra arguments.
sale() {
    local out=$1
    shift
    psql_base -c CHECKPOINT >/dev/null
    "$BIN/flashgate-loadtest" sale --base-url "http://127.0.0.1:$GW_PORT" --ops-url "http://127.0.0.1:$OPS_PORT" \
        --database-url "$DB_URL" --stock 100000 --buckets 32 --users 200000 --per-user-limit 1 \
        --concurrency 64 --duration-max-seconds 180 --out "$WORK/$out.json" "$@" >/dev/null || [ $? = 2 ]
}
json() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print($2)" "$1"; }
PURCHASES='r["verdict"]["created"] / (r["sold_out_after_seconds"] or r["elapsed_seconds"])'

log "warm-up sale (not counted)"
sale warm
for pair in $(seq "$PAIRS"); do
    # Alternate which goes first, so a drift of the machine's load favours neither.
    if [ $((pair % 2)) = 1 ]; then order="none subscribed"; else order="subscribed none"; fi
    for kind in $order; do
        log "pair $pair: sale with $kind"
        if [ "$kind" = subscribed ]; then sale "$kind-$pair" --events-receiver; else sale "$kind-$pair"; fi
    done
    none=$(json "$WORK/none-$pair.json" "$PURCHASES")
    with=$(json "$WORK/subscribed-$pair.json" "$PURCHASES")
    drain=$(json "$WORK/subscribed-$pair.json" 'r["events"]["drain_events_per_second"]')
    echo "pair $pair: purchases/s none $(printf %.0f "$none"), subscribed $(printf %.0f "$with"), ratio $(python3 -c "print(f'{$with/$none:.3f}')");" \
        "$(json "$WORK/subscribed-$pair.json" 'r["events"]["live_by_sale_end"]') delivered during the sale;" \
        "backlog $(json "$WORK/subscribed-$pair.json" 'r["events"]["replayed_backlog"]') events replayed, drained at $(printf %.0f "$drain")/s," \
        "$(json "$WORK/subscribed-$pair.json" 'r["events"]["violations"]') out of sequence," \
        "verdicts $(json "$WORK/none-$pair.json" 'r["verdict"]["ok"]')/$(json "$WORK/subscribed-$pair.json" 'r["verdict"]["ok"]')"
    echo "$none $with $drain" >>"$WORK/figures"
done
python3 - "$WORK/figures" <<'PY'
import statistics, sys
rows = [list(map(float, line.split())) for line in open(sys.argv[1])]
def show(name, values, fmt):
    print(f"{name}: median {fmt.format(statistics.median(values))}, range {fmt.format(min(values))} to {fmt.format(max(values))}")
show("purchases/s, no endpoint", [r[0] for r in rows], "{:.0f}")
show("purchases/s, one endpoint", [r[1] for r in rows], "{:.0f}")
show("ratio subscribed/none (per pair)", [r[1] / r[0] for r in rows], "{:.3f}")
show("backlog drain, events/s", [r[2] for r in rows], "{:.0f}")
PY
