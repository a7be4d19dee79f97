#!/usr/bin/env bash
# The crowd rehearsal (not part of CI): one line of 10,000, 100,000 and 1,000,000 tickets,
# each waiting behind nginx with config/nginx/edge.conf, against a real gateway with a fresh
# database and a private Redis (its own server, so its command counts are the gateway's
# alone, and its own key prefix). For each size it runs `flashgate-loadtest crowd`, which
# reports origin requests/s (public and personal, the ticket polls answered from memory and
# as check-ins), Redis commands/s and Redis CPU and the edge's hit ratio over a window after
# the line opens, and checks fairness, max_active and the stock. Then it draws
# docs/images/crowd.svg and prints the table docs/SCALING.md shows.
#
# Loopback only; every step is bounded (the 1,000,000 line takes about five minutes, most
# of it taking the tickets). nginx and redis-server are installed from Debian when missing.
#
# Usage: loadtest/crowd.sh [SIZE ...]        (default: 10000 100000 1000000)
#   CROWD_ORDER=random loadtest/crowd.sh 10000   the same with a random-order (lottery) line
#   CROWD_IGNORE_WINDOW_PERCENT=25 loadtest/crowd.sh   a quarter of the crowd ignores the
#       check-in window: it polls its ticket from the moment it joins (default 0)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SIZES=("$@")
((${#SIZES[@]})) || SIZES=(10000 100000 1000000)
ORDER=${CROWD_ORDER:-fifo}
MEASURE_SECONDS=${CROWD_MEASURE_SECONDS:-30}
IGNORE_PERCENT=${CROWD_IGNORE_WINDOW_PERCENT:-0}
BASE_URL_DB=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
DB_PREFIX=${BASE_URL_DB%/*}
RUN_ID=$(date +%s)
export FLASHGATE_JWT_SECRET="crowd-jwt-secret-$RUN_ID-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
export FLASHGATE_ADMIN_TOKEN="crowd-admin-token-$RUN_ID-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
export FLASHGATE__WAITING_ROOM__PASS_SECRET="crowd-pass-secret-$RUN_ID-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
WORK=$(mktemp -d)
PIDS=()

log() { printf 'crowd: %s\n' "$*" >&2; }
psql_base() { psql "$BASE_URL_DB" -qAt "$@"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
    for _ in $(seq 150); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.2; done
    return 1
}
stop_all() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    PIDS=()
}
cleanup() {
    stop_all
    for name in $(psql_base -c "SELECT datname FROM pg_database WHERE datname LIKE 'fg\_crowd\_%\_$RUN_ID'" 2>/dev/null); do
        psql_base -c "DROP DATABASE IF EXISTS $name WITH (FORCE)" >/dev/null 2>&1 || true
    done
    [ -n "${KEEP_WORK:-}" ] && log "work files kept in $WORK" || rm -rf "$WORK"
}
trap cleanup EXIT

bash scripts/services.sh
missing=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if ((${#missing[@]})); then
    log "apt-get install -y ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

log "building release binaries"
cargo build --release -q -p flashgate -p flashgate-loadtest

# One size: fresh database, private Redis, gateway, edge; then the crowd.
rehearse() {
    local size=$1 dir="$WORK/$1"
    # nginx's workers run as an unprivileged user: they must reach and write these.
    mkdir -p "$dir/cache" "$dir/body" "$dir/proxy"
    chmod 755 "$WORK" "$dir"
    chmod 777 "$dir/cache" "$dir/body" "$dir/proxy"
    local db="fg_crowd_${size}_${RUN_ID}"
    psql_base -c "CREATE DATABASE $db" >/dev/null
    local redis_port gw_port ops_port edge_port
    redis_port=$(free_port) gw_port=$(free_port) ops_port=$(free_port) edge_port=$(free_port)
    redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$dir" --logfile "$dir/redis.log" &
    PIDS+=($!)
    wait_port "$redis_port" || { log "redis did not start"; exit 1; }
    # The line's pace for the rehearsal: holders who never check in are skipped 10 s after
    # their last sign of life; those near the front poll every 2 s at most.
    DATABASE_URL="$DB_PREFIX/$db" REDIS_URL="redis://127.0.0.1:$redis_port" \
    FLASHGATE_LISTEN="127.0.0.1:$gw_port" FLASHGATE_OPS_LISTEN="127.0.0.1:$ops_port" RUST_LOG=warn \
    FLASHGATE__REDIS__KEY_PREFIX="crowd$RUN_ID:" FLASHGATE__REDIS__COMMAND_TIMEOUT_MS=1000 \
    FLASHGATE__WAITING_ROOM__ABANDON_AFTER_SECONDS=10 FLASHGATE__WAITING_ROOM__REFRESH_AFTER_SECONDS_MAX=2 \
    FLASHGATE__LIMITS__PER_IP__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_IP__BURST=1000000 \
    FLASHGATE__LIMITS__PER_USER__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_USER__BURST=1000000 \
    FLASHGATE__LIMITS__PER_DEAL__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_DEAL__BURST=1000000 \
        target/release/flashgate serve >"$dir/gateway.log" 2>&1 &
    PIDS+=($!)
    wait_port "$gw_port" || { log "the gateway did not start: $(tail -5 "$dir/gateway.log")"; exit 1; }
    sed -e "s|@ORIGIN@|127.0.0.1:$gw_port|" -e "s|@LISTEN@|127.0.0.1:$edge_port|" \
        -e "s|@CACHE_DIR@|$dir/cache|" config/nginx/edge.conf >"$dir/edge.conf"
    cat >"$dir/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $dir/nginx.pid;
error_log $dir/nginx-error.log warn;
events { worker_connections 8192; }
http {
    client_body_temp_path $dir/body;
    proxy_temp_path $dir/proxy;
    include $dir/edge.conf;
}
CONF
    "$NGINX" -p "$dir" -c "$dir/nginx.conf" &
    PIDS+=($!)
    wait_port "$edge_port" || { log "nginx did not start: $(cat "$dir/nginx-error.log")"; exit 1; }
    # A fifo line is paused while the tickets are taken and opens once the abandon grace has
    # passed for the last of them; a random line opens at its time (and needs every ticket
    # taken by then: joins run at a few thousand a second).
    local open_after=20
    [ "$ORDER" = fifo ] || open_after=$((size / 2000 + 20))
    log "$size tickets, $ORDER, ${IGNORE_PERCENT} % ignoring the window, opening after ${open_after}s, measuring ${MEASURE_SECONDS}s"
    local rc=0
    target/release/flashgate-loadtest crowd --tickets "$size" --queue-order "$ORDER" \
        --edge-url "http://127.0.0.1:$edge_port" --origin-url "http://127.0.0.1:$gw_port" \
        --ops-url "http://127.0.0.1:$ops_port" --redis-url "redis://127.0.0.1:$redis_port" \
        --redis-key-prefix "crowd$RUN_ID:" --database-url "$DB_PREFIX/$db" \
        --open-after-seconds "$open_after" --grace-seconds 10 --measure-seconds "$MEASURE_SECONDS" \
        --ignore-window-percent "$IGNORE_PERCENT" \
        --out "$WORK/crowd-$size.json" >"$dir/crowd.out" || rc=$?
    stop_all
    cp "$WORK/crowd-$size.json" "$WORK/result-$size.json" 2>/dev/null || true
    [ "$rc" -eq 0 ] || { log "the $size rehearsal failed ($rc): $(tail -20 "$dir/crowd.out")"; return "$rc"; }
}

status=0
for size in "${SIZES[@]}"; do rehearse "$size" || status=$?; done
results=("$WORK"/crowd-*.json)
[ -e "${results[0]}" ] || exit 1
# The chart in the docs is the fifo line's; a random line's goes beside its results.
chart=docs/images/crowd.svg
[ "$ORDER" = fifo ] || chart="$WORK/crowd-$ORDER.svg"
target/release/flashgate-loadtest crowd-chart --out "$chart" "${results[@]}"
python3 - "${results[@]}" <<'PY'
import json, sys
runs = sorted((json.load(open(p)) for p in sys.argv[1:]), key=lambda r: r["tickets"])
print("| waiting | ignoring the window | crowd's public polls/s (modelled) | edge requests/s | edge hit ratio | origin public/s | origin ticket polls/s | of which from memory/s | check-ins/s | Redis commands/s (those in scripts too) | Redis scripts/s | Redis CPU | fairness, max_active, stock |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for r in runs:
    m, f = r["measured"], r["fairness"]
    checks = "ok" if r["ok"] else "FAILED " + json.dumps(f["checks"])
    print(f"| {r['tickets']:,} | {r['ignore_window_percent']} % | {m['crowd_public_polls_per_second_modelled']:,.0f} | {m['edge_public_requests_per_second']:,.0f} "
          f"| {100 * m['edge_hit_ratio']:.2f} % | {m['origin_public_per_second']:.2f} | {m['origin_personal_per_second']:,.0f} "
          f"| {m['ticket_polls_from_memory_per_second']:,.0f} | {m['ticket_polls_checked_in_per_second']:,.0f} "
          f"| {m['redis_commands_per_second']:,.0f} | {sum(c['per_second'] for c in m['redis_top_commands'] if c['command'].startswith('eval')):,.0f} "
          f"| {m['redis_cpu_percent']:.1f} % ({m['redis_cpu_seconds']:.2f} s) "
          f"| {checks}: {f['admitted']} admitted in order, {f['abandoned_skipped']} abandoned skipped, max {f['max_active_seen']}/{r['max_active']} active, {f['orders']} orders/{r['stock']} units |")
for r in runs:
    top = ", ".join(f"{c['command']} {c['per_second']:,.0f}" for c in r["measured"]["redis_top_commands"])
    print(f"redis commands/s at {r['tickets']:,}: {top}", file=sys.stderr)
for r in runs:
    print(f"joins: {r['tickets']:,} in {r['join_seconds']:.0f} s ({r['joins_per_second']:,.0f}/s)", file=sys.stderr)
PY
exit "$status"
