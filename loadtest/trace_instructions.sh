#!/usr/bin/env bash
# What tracing costs in instructions, which a busy machine does not blur: the gateway (shipped
# config/default.toml, per-deal and per-IP limits lifted as in loadtest/trace_cost.sh) runs
# under valgrind's callgrind twice, tracing off and tracing on at 1 % with
# scripts/otlp_receiver.py as the collector. Instructions are counted only while the load
# runs (after a warm-up): a sale of SALE units to as many buyers (every order placed, so the
# count of purchases is fixed), then a flood of FLOOD orders on a sold-out deal (every one
# refused from memory, 409). It prints the gateway's instructions per purchase and per
# refusal, off and on, and their ratios. Loopback only; every run is bounded in time.
#
# Usage: loadtest/trace_instructions.sh [--bin DIR] [SALE, default 2000] [FLOOD, default 20000]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BIN=target/release
if [ "${1:-}" = --bin ]; then
    BIN=${2:?--bin needs a directory}
    shift 2
fi
SALE=${1:-2000}
FLOOD=${2:-20000}
BASE_URL_DB=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
RUN_ID=$(date +%s)
secret() { echo "trace-instr-$1-$RUN_ID-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"; }
export FLASHGATE_JWT_SECRET=$(secret jwt)
export FLASHGATE_ADMIN_TOKEN=$(secret admin)
export FLASHGATE__WAITING_ROOM__PASS_SECRET=$(secret pass)
WORK=$(mktemp -d)
PIDS=()
log() { printf 'trace-instructions: %s\n' "$*" >&2; }
psql_base() { psql "$BASE_URL_DB" -qAt "$@"; }
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
    for kind in off on; do
        psql_base -c "DROP DATABASE IF EXISTS fg_trace_instr_${kind}_$RUN_ID WITH (FORCE)" >/dev/null 2>&1 || true
    done
}
trap cleanup EXIT

bash scripts/services.sh
bash scripts/otlp.sh
command -v valgrind >/dev/null || { log "valgrind is missing (Debian package valgrind)"; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RECEIVER_PORT=$(free_port)
python3 scripts/otlp_receiver.py "$RECEIVER_PORT" "$WORK/spans.jsonl" 2>"$WORK/receiver.log" &
PIDS+=("$!")

# The instructions of callgrind dump $1.
instructions() { awk '/^(summary|totals):/ {print $2; exit}' "$1"; }

# One gateway under callgrind, tracing $1, with extra environment $2..; prints
# "instructions_per_purchase instructions_per_refusal purchases refusals".
measure() {
    local kind=$1 db port ops pid
    shift
    db="${BASE_URL_DB%/*}/fg_trace_instr_${kind}_$RUN_ID"
    psql_base -c "CREATE DATABASE fg_trace_instr_${kind}_$RUN_ID" >/dev/null
    port=$(free_port)
    ops=$(free_port)
    env "$@" DATABASE_URL="$db" FLASHGATE_LISTEN="127.0.0.1:$port" FLASHGATE_OPS_LISTEN="127.0.0.1:$ops" \
        RUST_LOG=warn FLASHGATE__REDIS__KEY_PREFIX="trinstr${kind}${RUN_ID}:" \
        FLASHGATE__LIMITS__PER_IP__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_IP__BURST=1000000 \
        FLASHGATE__LIMITS__PER_DEAL__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_DEAL__BURST=1000000 \
        valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$WORK/cg-$kind.%p" \
        "$BIN/flashgate" serve >"$WORK/gateway-$kind.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    for _ in $(seq 1200); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
    local common=(--base-url "http://127.0.0.1:$port" --ops-url "http://127.0.0.1:$ops")
    local sale=(sale "${common[@]}" --database-url "$db" --buckets 32 --per-user-limit 1 --concurrency 64
        --duration-max-seconds 300)
    log "tracing $kind: warm-up"
    "$BIN/flashgate-loadtest" "${sale[@]}" --stock 200 --users 200 --out "$WORK/warm-$kind.json" >/dev/null
    callgrind_control -i on "$pid" >/dev/null
    log "tracing $kind: a sale of $SALE units"
    "$BIN/flashgate-loadtest" "${sale[@]}" --stock "$SALE" --users "$SALE" --out "$WORK/sale-$kind.json" >/dev/null
    callgrind_control -d "$pid" >/dev/null
    log "tracing $kind: $FLOOD orders on a sold-out deal"
    "$BIN/flashgate-loadtest" flood "${common[@]}" --users "$FLOOD" --stock 0 --concurrency 64 \
        --duration-max-seconds 300 --settle-seconds 0 --out "$WORK/flood-$kind.json" >/dev/null 2>&1
    callgrind_control -d "$pid" >/dev/null
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    python3 - "$WORK/sale-$kind.json" "$WORK/flood-$kind.json" \
        "$(instructions "$WORK/cg-$kind.$pid.1")" "$(instructions "$WORK/cg-$kind.$pid.2")" <<'PY'
import json, sys
sale, flood = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
purchases, refusals = sale["verdict"]["created"], flood["statuses"].get("409", 0)
print(int(sys.argv[3]) / purchases, int(sys.argv[4]) / max(refusals, 1), purchases, refusals)
PY
}

read -r OFF_BUY OFF_REFUSE OFF_N OFF_R < <(measure off)
read -r ON_BUY ON_REFUSE ON_N ON_R < <(measure on FLASHGATE__TELEMETRY__OTLP_ENDPOINT="http://127.0.0.1:$RECEIVER_PORT" \
    FLASHGATE__TELEMETRY__TRACE_RATIO=0.01)
python3 - "$OFF_BUY" "$OFF_REFUSE" "$ON_BUY" "$ON_REFUSE" "$OFF_N" "$OFF_R" "$ON_N" "$ON_R" "$(wc -l <"$WORK/spans.jsonl")" <<'PY'
import sys
ob, orf, nb, nrf = map(float, sys.argv[1:5])
on_, or_, nn, nr, spans = sys.argv[5:]
print(f"instructions per purchase: off {ob:,.0f}, on {nb:,.0f}, on / off {nb / ob:.3f} ({on_} and {nn} purchases)")
print(f"instructions per refusal: off {orf:,.0f}, on {nrf:,.0f}, on / off {nrf / orf:.3f} ({or_} and {nr} refusals)")
print(f"receiver: {spans} spans decoded")
PY
