#!/usr/bin/env bash
# What tracing costs, side by side in one run: two gateways with the shipped
# config/default.toml, each on a database of its own, one with tracing off and one with
# `telemetry.otlp_endpoint` at scripts/otlp_receiver.py (a real OTLP receiver, decoding every
# export with the OpenTelemetry definitions) and `telemetry.trace_ratio = 0.01`. Rounds
# alternate them (off then on, then on then off, so a drift of the machine's load favours
# neither); each run is a closed-loop sale, 64 in flight (purchases/s, the gateway's CPU per
# purchase), then a flood of a sold-out deal, 128 in flight, one order each from up to
# 200,000 users (refusals/s, the gateway's CPU per refusal). The per-deal and per-IP limits
# are lifted (the buyers share one address, as in loadtest/compare.sh); nothing else is
# changed. It prints each run, the medians and the ratios on / off, and how many spans and
# traces the receiver decoded.
# Loopback only; every run is bounded in time.
#
# Usage: loadtest/trace_cost.sh [--bin DIR] [rounds, default 3] [seconds per run, default 10]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BIN=target/release
if [ "${1:-}" = --bin ]; then
    BIN=${2:?--bin needs a directory}
    shift 2
fi
ROUNDS=${1:-3}
SECONDS_EACH=${2:-10}
BASE_URL_DB=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
RUN_ID=$(date +%s)
secret() { echo "trace-cost-$1-$RUN_ID-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"; }
export FLASHGATE_JWT_SECRET=$(secret jwt)
export FLASHGATE_ADMIN_TOKEN=$(secret admin)
export FLASHGATE__WAITING_ROOM__PASS_SECRET=$(secret pass)
WORK=$(mktemp -d)
PIDS=()
log() { printf 'trace-cost: %s\n' "$*" >&2; }
psql_base() { psql "$BASE_URL_DB" -qAt "$@"; }
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
    for kind in off on; do
        psql_base -c "DROP DATABASE IF EXISTS fg_trace_cost_${kind}_$RUN_ID WITH (FORCE)" >/dev/null 2>&1 || true
    done
}
trap cleanup EXIT

bash scripts/services.sh
bash scripts/otlp.sh
for binary in flashgate flashgate-loadtest; do
    [ -x "$BIN/$binary" ] || { log "$BIN/$binary is missing (cargo build --release -p flashgate -p flashgate-loadtest)"; exit 1; }
done
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
CLK_TCK=$(getconf CLK_TCK)
ticks_of() { awk '{print $14 + $15}' "/proc/$1/stat"; }

RECEIVER_PORT=$(free_port)
python3 scripts/otlp_receiver.py "$RECEIVER_PORT" "$WORK/spans.jsonl" 2>"$WORK/receiver.log" &
PIDS+=("$!")

# Starts the gateway $1 (off or on) with extra environment $2..; sets <KIND>_PID, _PORT, _OPS, _DB.
start_gateway() {
    local kind=$1 db port ops
    shift
    db="${BASE_URL_DB%/*}/fg_trace_cost_${kind}_$RUN_ID"
    psql_base -c "CREATE DATABASE fg_trace_cost_${kind}_$RUN_ID" >/dev/null
    port=$(free_port)
    ops=$(free_port)
    env "$@" DATABASE_URL="$db" FLASHGATE_LISTEN="127.0.0.1:$port" FLASHGATE_OPS_LISTEN="127.0.0.1:$ops" \
        RUST_LOG=warn FLASHGATE__REDIS__KEY_PREFIX="trcost${kind}${RUN_ID}:" \
        FLASHGATE__LIMITS__PER_IP__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_IP__BURST=1000000 \
        FLASHGATE__LIMITS__PER_DEAL__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_DEAL__BURST=1000000 \
        "$BIN/flashgate" serve >"$WORK/gateway-$kind.log" 2>&1 &
    PIDS+=("$!")
    printf -v "${kind^^}_PID" %s "$!"
    printf -v "${kind^^}_PORT" %s "$port"
    printf -v "${kind^^}_OPS" %s "$ops"
    printf -v "${kind^^}_DB" %s "$db"
    for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && return; sleep 0.1; done
    log "the gateway with tracing $kind did not start"
    cat "$WORK/gateway-$kind.log" >&2
    exit 1
}
start_gateway off
start_gateway on FLASHGATE__TELEMETRY__OTLP_ENDPOINT="http://127.0.0.1:$RECEIVER_PORT" \
    FLASHGATE__TELEMETRY__TRACE_RATIO=0.01

# One run against gateway $1 of $2 (sale or flood), named $3; its report and the gateway's
# CPU ticks over it.
run() {
    local kind=$1 what=$2 name=$3 pid port ops db before
    pid=${kind^^}_PID port=${kind^^}_PORT ops=${kind^^}_OPS db=${kind^^}_DB
    local common=(--base-url "http://127.0.0.1:${!port}" --ops-url "http://127.0.0.1:${!ops}")
    psql_base -c CHECKPOINT >/dev/null
    before=$(ticks_of "${!pid}")
    if [ "$what" = sale ]; then
        "$BIN/flashgate-loadtest" sale "${common[@]}" --database-url "${!db}" --stock 10000000 --buckets 32 \
            --users 400000 --attempts 1 --per-user-limit 1 --concurrency 64 \
            --duration-max-seconds "$SECONDS_EACH" --out "$WORK/$name.json" >/dev/null || [ $? = 2 ]
    else
        "$BIN/flashgate-loadtest" flood "${common[@]}" --users 200000 --stock 0 --concurrency 128 \
            --duration-max-seconds "$SECONDS_EACH" --settle-seconds 0 --out "$WORK/$name.json" \
            >/dev/null 2>"$WORK/$name.log"
    fi
    echo "$(( $(ticks_of "${!pid}") - before ))" >"$WORK/$name.ticks"
}

for kind in off on; do
    log "warm-up sale, tracing $kind (not counted)"
    SECONDS_EACH=2 run "$kind" sale "warm-$kind"
done
for round in $(seq "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then order="off on"; else order="on off"; fi
    for kind in $order; do
        for what in sale flood; do
            log "round $round, tracing $kind: $what, ${SECONDS_EACH}s"
            run "$kind" "$what" "$what-$kind-$round"
        done
    done
done

python3 - "$WORK" "$ROUNDS" "$CLK_TCK" <<'PY'
import json, statistics, sys
work, rounds, clk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(name):
    return json.load(open(f"{work}/{name}.json")), int(open(f"{work}/{name}.ticks").read())
figures = {}
for kind in ("off", "on"):
    for r in range(1, rounds + 1):
        sale, sale_ticks = load(f"sale-{kind}-{r}")
        flood, flood_ticks = load(f"flood-{kind}-{r}")
        created = sale["verdict"]["created"]
        row = (created / sale["elapsed_seconds"], sale_ticks / clk / max(created, 1) * 1e6,
               flood["requests_per_second"], flood_ticks / clk / max(flood["sent"], 1) * 1e6)
        others = {k: v for k, v in flood["statuses"].items() if k != "409"}
        print(f"round {r}, tracing {kind}: {row[0]:.1f} purchases/s ({row[1]:.0f} µs gateway CPU each, "
              f"verdict {'ok' if sale['verdict']['ok'] else 'FAILED'}), {row[2]:.0f} refusals/s "
              f"({row[3]:.1f} µs each{', other answers ' + str(others) if others else ''})")
        figures.setdefault(kind, []).append(row)
names = ("purchases/s", "gateway CPU µs per purchase", "refusals/s (409)", "gateway CPU µs per refusal")
for i, name in enumerate(names):
    off = statistics.median(r[i] for r in figures["off"])
    on = statistics.median(r[i] for r in figures["on"])
    pairs = ", ".join(f"{b[i] / a[i]:.3f}" for a, b in zip(figures["off"], figures["on"]))
    print(f"{name}: median off {off:.1f}, on {on:.1f}, on / off {on / off:.3f} (per round {pairs})")
spans = [json.loads(line) for line in open(f"{work}/spans.jsonl")] if rounds else []
traces = {s["trace_id"] for s in spans}
print(f"receiver: {len(spans)} spans decoded, {len(traces)} traces")
PY
