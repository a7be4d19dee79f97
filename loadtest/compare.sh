#!/usr/bin/env bash
# One run, one machine, side by side:
#   (a) the seed design: one hot stock row, one transaction per purchase (pgbench)
#   (b) the same spread over 32 bucket rows (pgbench)
#   (c) flashgate end to end: HTTP, auth, limits, reservation and order, durable
# and the ratios (c)/(a), (c)/(b). For (c) it also measures what a purchase costs:
# CPU time of the gateway process and of the PostgreSQL processes serving it (backends of
# its database, WAL writer, checkpointer, background writer) divided by purchases, how busy
# the machine's cores were, the load generator's own CPU, reservation batch sizes (mean,
# p99), batches in flight and batches decided again; then an open-loop run at half the
# measured rate (201 p50/p99), and a whole sale of 100,000 units to 200,000 users, charted,
# with the database verdict.
# Then refusals against a fair baseline (wrk, loadtest/refusal.lua): flashgate refusing an
# order for a sold-out deal (409) and over the per-IP limit (429), each next to a bare
# hyper server replaying the very answer captured from the gateway to the very same
# request (body unread), alternated, with requests/s and process CPU per request.
# Then a flood of a million distinct users (tokens of their own, addresses of their own
# through a trusted proxy's header) against a sold-out deal and against an open one, each
# on a gateway of its own with the shipped settings, with the gateway's resident memory
# read from /proc during the flood and after its limiters' idle keys and caches expired.
# Writes the results into docs/PERFORMANCE.md between the COMPARISON, REFUSALS and FLOOD
# markers. Loopback only; every step is bounded in time.
#
# Usage: loadtest/compare.sh [--bin DIR] [--refusals | --purchases | --flood | --tokens] [seconds per measurement, default 10]
#   --refusals: only the refusal comparison (and only its block of the document).
#   --flood: only the flood (and only its block); FLOOD_USERS=N floods fewer users,
#   FLOOD_TOKENS=rs256 with provider tokens, FLOOD_DEALS="open" one deal only, and then
#   writes nothing.
#   --purchases: only (c) and the open loop, printed and not written anywhere: the quick
#   check of a change to the purchase path. The gateway runs with the shipped
#   config/default.toml; a setting can be tried in the environment
#   (FLASHGATE__ORDERS__LANES=2 loadtest/compare.sh --purchases 10), but the figures the
#   docs report are the defaults'.
#   --tokens: RS256 provider tokens against HS256 ones on one gateway (shipped settings plus
#   the load tester's JWKS and lifted rate limits), alternated ROUNDS_TOKENS times (default
#   5): purchases/s and a sold-out deal's flood requests/s (its buyers over and over for
#   the whole run), with the gateway's CPU per
#   request; printed, not written. Every buyer has a token of its own, TOKENS_USERS
#   (default 30000) per run, all signed before the run's clock starts.
#   --gateways N: with --purchases, N gateways on the one database and Redis, the load
#   tester's requests spread over them (a buyer's successive attempts on successive
#   gateways), their CPU summed; then every one of 2,000 buyers tries 10 times through them
#   with a per-user limit of 1, and the database must show each holding exactly one order.
#   --bin DIR: run the flashgate and flashgate-loadtest binaries found in DIR instead of
#   building this tree's, to alternate two builds side by side (a copy of an earlier
#   target/release, say). Only with --purchases, --refusals, --flood or --tokens: the full run writes the docs
#   of this tree.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MODE=all
BIN=target/release
BIN_GIVEN=
GATEWAYS=1
while [ $# -gt 0 ]; do
    case "$1" in
        --gateways)
            GATEWAYS=${2:?--gateways needs a number}
            shift 2
            ;;
        --refusals | --purchases | --flood | --tokens)
            MODE=${1#--}
            shift
            ;;
        --bin)
            BIN=${2:?--bin needs a directory}
            BIN_GIVEN=1
            shift 2
            ;;
        *) break ;;
    esac
done
if [ -n "$BIN_GIVEN" ] && [ "$MODE" = all ]; then
    echo "compare: --bin goes with --purchases, --refusals, --flood or --tokens" >&2
    exit 64
fi
if [ "$GATEWAYS" != 1 ] && [ "$MODE" != purchases ]; then
    echo "compare: --gateways goes with --purchases" >&2
    exit 64
fi
SECONDS_EACH=${1:-10}
COMMAND="loadtest/compare.sh $([ "$MODE" = all ] || echo "--$MODE ")$SECONDS_EACH"
[ "$MODE" = flood ] && COMMAND="loadtest/compare.sh --flood"
# Rounds of the refusal comparison; each round measures gateway then baseline.
ROUNDS=2
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
    if [ -n "${KEEP_WORK:-}" ]; then
        log "work files kept in $WORK, databases fg_cmp_*_$RUN_ID kept"
    else
        rm -rf "$WORK"
        drop_run_dbs
    fi
}
# The databases of this run (fresh_db runs in command substitutions, so they are found by
# name rather than remembered).
drop_run_dbs() {
    local name
    for name in $(psql_base -c "SELECT datname FROM pg_database WHERE datname LIKE 'fg\_cmp\_%\_$RUN_ID'" 2>/dev/null); do
        psql_base -c "DROP DATABASE IF EXISTS $name WITH (FORCE)" >/dev/null 2>&1 || true
    done
}
trap cleanup EXIT

log() { printf 'compare: %s\n' "$*" >&2; }

bash scripts/services.sh
if ! command -v wrk >/dev/null; then
    log "installing wrk"
    apt-get update -qq && apt-get install -y -qq wrk >/dev/null
fi
command -v pgbench >/dev/null || { log "pgbench is missing (Debian package postgresql-client)"; exit 1; }

if [ -z "$BIN_GIVEN" ]; then
    log "building release binaries"
    cargo build --release -q --workspace
fi
for binary in flashgate flashgate-loadtest; do
    [ -x "$BIN/$binary" ] || { log "$BIN/$binary is missing"; exit 1; }
done

psql_base() { psql "$BASE_URL_DB" -qAt "$@"; }
# Every measured run starts from a checkpoint with the kernel's dirty pages on disk: what an
# earlier run left behind is written out before, not during, the next one.
checkpoint() { psql_base -c CHECKPOINT >/dev/null; sync; }
fresh_db() {
    local name="fg_cmp_${1}_${RUN_ID}"
    psql_base -c "DROP DATABASE IF EXISTS $name WITH (FORCE)" -c "CREATE DATABASE $name" >/dev/null
    echo "$DB_PREFIX/$name"
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# CPU accounting from /proc: clock ticks of user + system time.
CLK_TCK=$(getconf CLK_TCK)
ticks_of() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# Starts a gateway on database $1 with extra environment $2..; prints "pid port ops_port".
start_gateway() {
    local db=$1 port ops
    shift
    port=$(free_port)
    ops=$(free_port)
    env "$@" DATABASE_URL="$db" FLASHGATE_LISTEN="127.0.0.1:$port" FLASHGATE_OPS_LISTEN="127.0.0.1:$ops" \
        RUST_LOG=warn FLASHGATE__REDIS__KEY_PREFIX="cmp${RUN_ID}:" \
        "$BIN/flashgate" serve >>"$WORK/gateway.log" 2>&1 &
    local pid=$!
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
    echo "$pid $port $ops"
}

# --- refusals against a fair baseline ---------------------------------------------
# Two gateways on one database: one whose limits never bite (it refuses a sold-out deal,
# 409), one allowing a client address one request a second (it refuses with 429 before
# looking at the deal). Each refusal is captured once with curl; a bare server per refusal
# replays it. Then, alternating, wrk sends the same order request to each, and the
# server's process CPU over the run is divided by the requests answered.
REFUSAL_URL_PATH=/v1/deals/sold-out/orders
wrk_run() { # $1: url, $2: result file; prints nothing, fails when an answer was not a refusal
    FLASHGATE_WRK_TOKEN=$TOKEN wrk -t2 -c"$CLIENTS" -d"${SECONDS_EACH}s" -s loadtest/refusal.lua "$1" >"$2"
}
measure() { # $1: pid, $2: url, $3: label; appends "label rps requests ticks non_refusals"
    local before after out="$WORK/wrk.$3.$RANDOM"
    before=$(ticks_of "$1")
    wrk_run "$2" "$out"
    after=$(ticks_of "$1")
    local requests rps answered_2xx
    requests=$(awk '/ requests in / {print $1; exit}' "$out")
    rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
    answered_2xx=$(( requests - $(awk '/Non-2xx or 3xx responses:/ {print $5}' "$out" | grep . || echo 0) ))
    echo "$3 $rps $requests $((after - before)) $answered_2xx" >>"$WORK/refusals"
}
refusals() {
    local db gw409 gw429 bare409 bare429
    db=$(fresh_db refusals)
    read -r GW409_PID GW409_PORT GW409_OPS < <(start_gateway "$db" \
        FLASHGATE__LIMITS__PER_IP__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_IP__BURST=1000000)
    PIDS+=("$GW409_PID")
    read -r GW429_PID GW429_PORT _ < <(start_gateway "$db" \
        FLASHGATE__LIMITS__PER_IP__RATE_PER_SECOND=1 FLASHGATE__LIMITS__PER_IP__BURST=1)
    PIDS+=("$GW429_PID")
    curl -sf -X POST "http://127.0.0.1:$GW409_OPS/admin/deals" -H "Authorization: Bearer $FLASHGATE_ADMIN_TOKEN" \
        -d '{"id":"sold-out","name":"Sold out","stock":0,"buckets":1,"unit_price_minor":100,"currency":"EUR","per_user_limit":1,"reservation_ttl_seconds":60}' >/dev/null
    TOKEN=$("$BIN/flashgate" token --user wrk-user)
    gw409="http://127.0.0.1:$GW409_PORT$REFUSAL_URL_PATH"
    gw429="http://127.0.0.1:$GW429_PORT$REFUSAL_URL_PATH"
    capture() { # $1: url, $2: file; the same request as refusal.lua
        curl -si -X POST "$1" -H 'Content-Type: application/json' -H "Authorization: Bearer $TOKEN" \
            -H 'Idempotency-Key: wrk-refusal-0001' -d '{"quantity":1}' >"$2"
    }
    # The first requests to a fresh deal may reach PostgreSQL before the mirror knows it is
    # sold out; the second to the limited gateway is over its limit.
    for _ in $(seq 50); do
        capture "$gw409" "$WORK/answer409"
        head -1 "$WORK/answer409" | grep -q ' 409' && break
        sleep 0.1
    done
    capture "$gw429" "$WORK/answer429"
    capture "$gw429" "$WORK/answer429"
    head -1 "$WORK/answer409" | grep -q ' 409' || { log "the sold-out deal answered $(head -1 "$WORK/answer409")"; exit 1; }
    head -1 "$WORK/answer429" | grep -q ' 429' || { log "the limited gateway answered $(head -1 "$WORK/answer429")"; exit 1; }
    # Like for like: the bare server answers on as many threads as the gateway's runtime
    # chose from the cores (one current-thread runtime each), not on a runtime of its own size.
    BARE_LOOPS=$(curl -sf "http://127.0.0.1:$GW409_OPS/metrics" |
        awk '$1 == "flashgate_capacity{of=\"runtime_workers\"}" {print $2}' || true)
    BARE_LOOPS=${BARE_LOOPS:-0}
    local code port pid
    for code in 409 429; do
        port=$(free_port)
        "$BIN/flashgate-loadtest" bare-server --listen "127.0.0.1:$port" --answer "$WORK/answer$code" \
            --loops "$BARE_LOOPS" >"$WORK/bare$code.log" 2>&1 &
        pid=$!
        PIDS+=("$pid")
        for _ in $(seq 50); do grep -q listening "$WORK/bare$code.log" && break; sleep 0.1; done
        capture "http://127.0.0.1:$port$REFUSAL_URL_PATH" "$WORK/bare_answer$code"
        printf -v "BARE${code}_PID" %s "$pid"
        printf -v "BARE${code}_URL" %s "http://127.0.0.1:$port$REFUSAL_URL_PATH"
    done
    : >"$WORK/refusals"
    local round
    for round in $(seq "$ROUNDS"); do
        log "refusals, round $round of $ROUNDS: 409 and 429, gateway then bare, $CLIENTS connections, ${SECONDS_EACH}s each"
        measure "$GW409_PID" "$gw409" gw409
        measure "$BARE409_PID" "$BARE409_URL" bare409
        measure "$GW429_PID" "$gw429" gw429
        measure "$BARE429_PID" "$BARE429_URL" bare429
    done
    kill "$GW409_PID" "$GW429_PID" "$BARE409_PID" "$BARE429_PID" 2>/dev/null || true
    REFUSALS_TABLE=$(python3 - "$WORK" "$CLK_TCK" "$ROUNDS" "$SECONDS_EACH" "$CLIENTS" "$(date -u +%Y-%m-%d)" "$MACHINE_SHORT" "$COMMAND" "$BARE_LOOPS" <<'PY'
import sys
work, clk, rounds, secs, clients, day, machine, command, loops = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
threads = f"on {loops} thread(s), as many as the gateway's runtime chose from the cores" if loops != "0" else "on its own multi-thread runtime (the gateway did not report its threads)"
rows = {}
for line in open(f"{work}/refusals"):
    label, rps, requests, ticks, not_refused = line.split()
    if int(not_refused):
        sys.exit(f"{label}: {not_refused} answers were not refusals")
    rows.setdefault(label, []).append((float(rps), int(requests), int(ticks)))
def size(path):
    raw = open(path, "rb").read()
    head, _, body = raw.partition(b"\r\n\r\n")
    return len(raw), len(body)
def us(runs):
    return 1e6 * sum(t for _, _, t in runs) / clk / sum(n for _, n, _ in runs)
out = [f"Measured {day} by `{command}` on {machine}; wrk (2 threads, "
       f"{clients} connections, `loadtest/refusal.lua`: POST, bearer token, Idempotency-Key, 14-byte JSON "
       f"body) and the servers share the machine. {rounds} rounds, each {secs} s per server, alternated "
       "gateway, bare, gateway, bare. CPU is the server process's user + system time over its runs "
       f"divided by the requests it answered. The gateway runs the shipped defaults; the bare server "
       f"answers {threads}.", "",
       "| refusal | server | requests/s per round | CPU per request | answer bytes (body) |",
       "|---|---|---|---|---|"]
ratios = []
for code, what in (("409", "sold out"), ("429", "per-IP limit")):
    gw, bare = rows[f"gw{code}"], rows[f"bare{code}"]
    for label, runs, name in ((f"gw{code}", gw, "flashgate"), (f"bare{code}", bare, "bare hyper, same answer")):
        total, body = size(f"{work}/{'answer' if label.startswith('gw') else 'bare_answer'}{code}")
        per_round = ", ".join(f"{r:,.0f}" for r, _, _ in runs)
        out.append(f"| {code} {what} | {name} | {per_round} | {us(runs):.1f} µs | {total} ({body}) |")
    rps_ratio = sum(r for r, _, _ in gw) / sum(r for r, _, _ in bare)
    ratios.append(f"| {code} {what} | {rps_ratio:.2f} (goal ≥ 0.9) | {us(gw) / us(bare):.2f} (goal ≤ 1.1) |")
out += ["", "| refusal | requests/s, flashgate / bare | CPU per request, flashgate / bare |", "|---|---|---|", *ratios]
print("\n".join(out))
PY
)
}

# --- a flood of distinct users, resident memory -------------------------------------
# Each flood gets a fresh gateway with the shipped settings, trusting loopback as its
# proxy so that every user comes from an address of its own (X-Forwarded-For). Sold out:
# a deal with no stock, every user refused. Open: a deal with a unit for every user, each
# user ordering once, so that every request goes the whole way (token, per-user limit,
# idempotency key, a durable order). Memory is sampled every half second, at the flood's
# end, and after FLOOD_SETTLE seconds: longer than `limits.retain_interval_ms` (the idle
# sweep of the limiters) and the deal cache's and sold-out holders' refresh.
FLOOD_USERS=${FLOOD_USERS:-1000000}
FLOOD_SETTLE=${FLOOD_SETTLE:-30}
# FLOOD_TOKENS=rs256: provider tokens (`flashgate-loadtest provider`'s JWKS) instead of
# HS256; FLOOD_DEALS: the deals flooded, each on a gateway of its own.
FLOOD_TOKENS=${FLOOD_TOKENS:-hs256}
FLOOD_DEALS=${FLOOD_DEALS:-sold-out open}
# Hard stop of each flood, whatever is left.
FLOOD_SECONDS_MAX=${FLOOD_SECONDS_MAX:-600}
FLOOD_SHIPPED=
[ "$FLOOD_USERS" = 1000000 ] && [ "$FLOOD_TOKENS" = hs256 ] && [ "$FLOOD_DEALS" = "sold-out open" ] && [ "$FLOOD_SECONDS_MAX" = 600 ] && FLOOD_SHIPPED=1
flood() {
    local db kind stock pid port ops provider=()
    : >"$WORK/flood"
    if [ "$FLOOD_TOKENS" = rs256 ]; then
        local jwks_port
        jwks_port=$(free_port)
        "$BIN/flashgate-loadtest" provider --listen "127.0.0.1:$jwks_port" 2>>"$WORK/provider.log" &
        PIDS+=("$!")
        for _ in $(seq 50); do curl -sf "http://127.0.0.1:$jwks_port/jwks.json" >/dev/null && break; sleep 0.1; done
        provider=(FLASHGATE__AUTH__OIDC__JWKS_URL="http://127.0.0.1:$jwks_port/jwks.json")
    fi
    for kind in $FLOOD_DEALS; do
        db=$(fresh_db "flood_${kind//-/_}")
        read -r pid port ops < <(start_gateway "$db" FLASHGATE__SERVER__TRUSTED_PROXIES='["127.0.0.1/32"]' "${provider[@]}")
        PIDS+=("$pid")
        stock=0
        [ "$kind" = open ] && stock=$FLOOD_USERS
        checkpoint
        log "flood, $kind deal: $FLOOD_USERS distinct users, one order each, then ${FLOOD_SETTLE}s to settle"
        "$BIN/flashgate-loadtest" flood --base-url "http://127.0.0.1:$port" --ops-url "http://127.0.0.1:$ops" \
            --users "$FLOOD_USERS" --stock "$stock" --concurrency 128 --duration-max-seconds "$FLOOD_SECONDS_MAX" \
            --token-kind "$FLOOD_TOKENS" \
            --distinct-addresses --gateway-pid "$pid" --settle-seconds "$FLOOD_SETTLE" \
            --out "$WORK/flood-$kind.json" >/dev/null 2>"$WORK/flood-$kind.log"
        kill "$pid" 2>/dev/null || true
        echo "$kind $WORK/flood-$kind.json" >>"$WORK/flood"
    done
    FLOOD_TABLE=$(python3 - "$WORK" "$FLOOD_USERS" "$FLOOD_SETTLE" "$(date -u +%Y-%m-%d)" "$MACHINE_SHORT" "$COMMAND" <<'PY'
import json, sys
work, users, settle, day, machine, command = sys.argv[1:]
mib = lambda kib: f"{kib / 1024:.0f} MiB"
out = [f"Measured {day} by `{command}` on {machine}; {int(users):,} distinct users (a token and an "
       "address each), one order each, 128 in flight, against a fresh gateway with the shipped "
       "settings (loopback trusted as the proxy) per deal. Resident memory of the gateway from "
       f"`/proc/<pid>/status`; settled: {settle} s after the flood.", "",
       "| deal | answers | requests/s | VmRSS before | VmHWM (peak) | VmRSS at the flood's end | VmRSS while settling, least / most | VmRSS settled | ≤ 256 MiB |",
       "|---|---|---|---|---|---|---|---|---|"]
for line in open(f"{work}/flood"):
    kind, path = line.split()
    r = json.load(open(path))
    answers = ", ".join(f"{n:,} × {s}" for s, n in sorted(r["statuses"].items()))
    before, end, after = r["memory_before"], r["memory_at_end"], r["memory_after_settle"]
    peak = max(end["hwm_kib"], after["hwm_kib"])
    settling = [kib for at, kib in r["rss_samples"] if at > r["elapsed_seconds"]] or [after["rss_kib"]]
    out.append(f"| {kind} | {answers} | {r['requests_per_second']:,.0f} | {mib(before['rss_kib'])} | "
               f"{mib(peak)} | {mib(end['rss_kib'])} | {mib(min(settling))} / {mib(max(settling))} | "
               f"{mib(after['rss_kib'])} | "
               f"{'yes' if peak <= 256 * 1024 and after['rss_kib'] <= 256 * 1024 else 'no'} |")
print("\n".join(out))
PY
)
}

# Writes $2 between the $1 markers of docs/PERFORMANCE.md (appending the block when missing).
write_block() {
    python3 - "$1" "$2" <<'PY'
import re, sys
name, table = sys.argv[1], sys.argv[2]
path = "docs/PERFORMANCE.md"
text = open(path).read()
begin, end = f"<!-- {name}:BEGIN -->", f"<!-- {name}:END -->"
block = begin + "\n" + table + "\n" + end
if begin in text:
    text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
else:
    text += "\n" + block + "\n"
open(path, "w").write(text)
PY
}

MACHINE_SHORT="$(nproc) CPUs ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo))"
# --- RS256 provider tokens against HS256 ---------------------------------------------
# One gateway accepting both: HS256 with the shared secret, RS256 verified with the keys
# `flashgate-loadtest provider` publishes. Runs alternate HS256 and RS256, each with a fresh
# set of distinct buyers (the token cache never helps); the gateway's CPU per answered
# request comes from /proc, read once the client has signed its tokens.
tokens() {
    local users=${TOKENS_USERS:-30000} rounds=${ROUNDS_TOKENS:-5} jwks_port db pid port ops
    jwks_port=$(free_port)
    "$BIN/flashgate-loadtest" provider --listen "127.0.0.1:$jwks_port" 2>>"$WORK/provider.log" &
    PIDS+=("$!")
    for _ in $(seq 50); do curl -sf "http://127.0.0.1:$jwks_port/jwks.json" >/dev/null && break; sleep 0.1; done
    db=$(fresh_db tokens)
    read -r pid port ops < <(start_gateway "$db" \
        FLASHGATE__AUTH__OIDC__JWKS_URL="http://127.0.0.1:$jwks_port/jwks.json" \
        FLASHGATE__LIMITS__PER_IP__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_IP__BURST=1000000 \
        FLASHGATE__LIMITS__PER_USER__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_USER__BURST=1000000 \
        FLASHGATE__LIMITS__PER_DEAL__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_DEAL__BURST=1000000)
    PIDS+=("$pid")
    local common=(--base-url "http://127.0.0.1:$port" --ops-url "http://127.0.0.1:$ops"
        --users "$users" --concurrency "$CLIENTS"
        --duration-max-seconds "$SECONDS_EACH")
    local round kind what
    for round in $(seq "$rounds"); do
        for kind in hs256 rs256; do
            for what in sale flood; do
                log "tokens round $round, $kind, $what: $users buyers, ${SECONDS_EACH}s at most"
                checkpoint
                local extra=(--stock 10000000 --buckets 32 --per-user-limit 1)
                # The flood goes round its buyers for the whole run: they would last a
                # fraction of a second, too short a span to read a rate from.
                [ "$what" = flood ] && extra=(--stock 0 --settle-seconds 0 --gateway-pid "$pid" --repeat)
                "$BIN/flashgate-loadtest" "$what" "${common[@]}" --token-kind "$kind" "${extra[@]}" \
                    --out "$WORK/tok-$what-$kind-$round.json" >/dev/null 2>"$WORK/tok-$what-$kind-$round.err" &
                local client=$! before
                # The gateway's CPU is counted once the client has signed its tokens.
                tokens_signed "$client" "$WORK/tok-$what-$kind-$round.err"
                before=$(ticks_of "$pid")
                wait "$client"
                echo "$(( $(ticks_of "$pid") - before ))" >"$WORK/tok-$what-$kind-$round.ticks"
            done
        done
    done
    kill "$pid" 2>/dev/null || true
    TOKENS_TABLE=$(python3 - "$WORK" "$rounds" "$users" "$CLK_TCK" <<'PY'
import json, statistics, sys
work, rounds, users, clk = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
def runs(what, kind):
    out = []
    for r in range(1, rounds + 1):
        report = json.load(open(f"{work}/tok-{what}-{kind}-{r}.json"))
        ticks = int(open(f"{work}/tok-{what}-{kind}-{r}.ticks").read())
        out.append((report, ticks))
    return out
def med(v):
    return f"{statistics.median(v):.0f} ({'/'.join(f'{x:.0f}' for x in v)})"
rows, medians = [], {}
for kind in ("hs256", "rs256"):
    sales, floods = runs("sale", kind), runs("flood", kind)
    buys = [s["verdict"]["created"] / s["elapsed_seconds"] for s, _ in sales]
    buy_us = [t / clk / max(s["requests"], 1) * 1e6 for s, t in sales]
    rps = [f["requests_per_second"] for f, _ in floods]
    flood_us = [t / clk / max(f["sent"], 1) * 1e6 for f, t in floods]
    other = sorted({k for s, _ in sales for k in s["latency_by_outcome"] if k != "201"}
                   | {k for f, _ in floods for k in f["statuses"] if k != "409"})
    ok = all(s["verdict"]["ok"] for s, _ in sales)
    medians[kind] = (statistics.median(buys), statistics.median(rps))
    rows.append(f"| {kind.upper()} | {med(buys)} | {med(buy_us)} | {med(rps)} | {med(flood_us)} | {', '.join(other) or 'none'}; verdicts {'ok' if ok else 'FAILED'} |")
print("| tokens | purchases/s | gateway CPU µs per purchase | sold-out flood requests/s | gateway CPU µs per refusal | other answers |")
print("|---|---|---|---|---|---|")
print("\n".join(rows))
(hb, hf), (rb, rf) = medians["hs256"], medians["rs256"]
print(f"\nRS256 / HS256 of the medians: purchases/s {rb / hb:.2f}, sold-out flood requests/s {rf / hf:.2f}"
      f" ({rounds} alternated rounds of each; {users} buyers per run, each with a token of its own)")
PY
)
}
# Waits until client $1 says in its log $2 that its tokens are signed (or it ended).
tokens_signed() {
    while kill -0 "$1" 2>/dev/null && ! grep -q "tokens signed" "$2"; do sleep 0.05; done
}

if [ "$MODE" = tokens ]; then
    tokens
    echo "$TOKENS_TABLE"
    exit 0
fi
if [ "$MODE" = refusals ]; then
    refusals
    echo "$REFUSALS_TABLE"
    write_block REFUSALS "$REFUSALS_TABLE"
    log "docs/PERFORMANCE.md updated (refusals)"
    exit 0
fi
if [ "$MODE" = flood ]; then
    flood
    echo "$FLOOD_TABLE"
    if [ -n "$FLOOD_SHIPPED" ]; then
        write_block FLOOD "$FLOOD_TABLE"
        log "docs/PERFORMANCE.md updated (flood)"
    fi
    exit 0
fi

# --- (a) and (b): pgbench ------------------------------------------------------------
if [ "$MODE" = all ]; then
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
checkpoint
log "(a) one hot row, $CLIENTS clients, ${SECONDS_EACH}s"
A=$(pgbench_tps "$WORK/hot.sql")
checkpoint
log "(b) 32 bucket rows, $CLIENTS clients, ${SECONDS_EACH}s"
B=$(pgbench_tps "$WORK/buckets.sql")
fi

# --- (c): flashgate end to end ------------------------------------------------------
# The gateway runs with the shipped defaults: its runtime threads, pools and lanes are the
# ones it chooses from the cores (config/default.toml). Only the rate limits are lifted, as
# 400,000 buyers come from one address.
GW_URL=$(fresh_db gateway)
GW_PIDS=()
OPS_PORTS=()
BASE_URLS=
for _ in $(seq "$GATEWAYS"); do
    read -r pid port ops < <(start_gateway "$GW_URL" \
        FLASHGATE__LIMITS__PER_IP__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_IP__BURST=1000000 \
        FLASHGATE__LIMITS__PER_USER__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_USER__BURST=1000000 \
        FLASHGATE__LIMITS__PER_DEAL__RATE_PER_SECOND=1000000 FLASHGATE__LIMITS__PER_DEAL__BURST=1000000)
    PIDS+=("$pid")
    GW_PIDS+=("$pid")
    OPS_PORTS+=("$ops")
    BASE_URLS+="${BASE_URLS:+,}http://127.0.0.1:$port"
done
GW_PID=${GW_PIDS[0]}
OPS_PORT=${OPS_PORTS[0]}
gateway_ticks() { local pid total=0; for pid in "${GW_PIDS[@]}"; do total=$((total + $(ticks_of "$pid"))); done; echo "$total"; }
# What the gateway chose from the cores (or was told), as it reports it.
capacity() {
    local value
    value=$(curl -sf "http://127.0.0.1:$OPS_PORT/metrics" | awk -v of="$1" '$1 == "flashgate_capacity{of=\"" of "\"}" {print $2}' || true)
    echo "${value:-?}"
}
GW_THREADS=$(capacity runtime_workers)
GW_CAPACITY="$GW_THREADS runtime thread(s), $(capacity request_pool_connections) request connections, $(capacity lanes) lanes"
GW_SETTINGS=$(env | grep '^FLASHGATE__' | grep -v -e '__LIMITS__' -e '__REDIS__KEY_PREFIX' -e '__WAITING_ROOM__PASS_SECRET' | sort | tr '\n' ' ' || true)
GW_SETTINGS=${GW_SETTINGS:-shipped defaults}

pg_pids() {
    psql_base -c "SELECT pid FROM pg_stat_activity WHERE datname = '${GW_URL##*/}'
                  OR backend_type IN ('walwriter', 'checkpointer', 'background writer')"
}
snapshot_pg() { for pid in $(pg_pids); do echo "$pid $(ticks_of "$pid")"; done; }
# Ticks used since snapshot file $1 by the PostgreSQL processes alive now (new ones count whole).
pg_ticks_since() {
    local total=0 pid before
    for pid in $(pg_pids); do
        before=$(awk -v p="$pid" '$1 == p {print $2}' "$1")
        total=$((total + $(ticks_of "$pid") - ${before:-0}))
    done
    echo "$total"
}
machine_ticks() { awk '/^cpu / {idle = $5 + $6; total = 0; for (i = 2; i <= NF; i++) total += $i; print idle, total}' /proc/stat; }
# Every gateway's series, one after the other (the parsers below add them up).
metrics_dump() {
    local ops
    for ops in "${OPS_PORTS[@]}"; do
        curl -sf "http://127.0.0.1:$ops/metrics" | grep -E '^flashgate_reservation_(batch_size|transaction_seconds_sum|batches_rechecked_total)'
    done > "$1"
}

# A sale whose verdict fails (exit 2) is reported with its reasons rather than ending the
# comparison; the script still exits non-zero at the end. Any other failure is fatal.
FAILED_VERDICTS=0
# Every load-tester command line as run, for docs/PERFORMANCE.md (where a test checks that
# each still parses).
SALE_COMMANDS=()
sale() {
    local rc=0
    local args=(sale --base-url "$BASE_URLS" --ops-url "http://127.0.0.1:$OPS_PORT"
        --database-url "$GW_URL" "$@")
    local line
    line=$(printf '%q ' "${args[@]}")
    SALE_COMMANDS+=("flashgate-loadtest ${line% }")
    "$BIN/flashgate-loadtest" "${args[@]}" || rc=$?
    if [ "$rc" = 2 ]; then
        FAILED_VERDICTS=$((FAILED_VERDICTS + 1))
        log "a sale's verdict failed: $*"
    elif [ "$rc" != 0 ]; then
        return "$rc"
    fi
}
verdict_of() { json "$1" '"ok=%s%s" % (r["verdict"]["ok"], "" if r["verdict"]["ok"] else " (" + "; ".join(r["verdict"]["reasons"]) + ")")'; }
json() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print($2)" "$1"; }

log "(c) warm-up, 2 s"
sale --stock 10000000 --buckets 32 --users 20000 --per-user-limit 1 --concurrency "$CLIENTS" \
    --duration-max-seconds 2 --out "$WORK/warm.json" >/dev/null
checkpoint
log "(c) flashgate purchases, $CLIENTS in flight, ${SECONDS_EACH}s"
snapshot_pg > "$WORK/pg_before"
GW_BEFORE=$(gateway_ticks)
read -r IDLE_BEFORE TOTAL_BEFORE < <(machine_ticks)
metrics_dump "$WORK/batch_before"
sale --stock 10000000 --buckets 32 --users 400000 --attempts 1 --per-user-limit 1 \
    --concurrency "$CLIENTS" --duration-max-seconds "$SECONDS_EACH" \
    --out "$WORK/sale.json" >"$WORK/sale.txt"
read -r IDLE_AFTER TOTAL_AFTER < <(machine_ticks)
GW_TICKS=$(( $(gateway_ticks) - GW_BEFORE ))
PG_TICKS=$(pg_ticks_since "$WORK/pg_before")
metrics_dump "$WORK/batch_after"
C_OK=$(verdict_of "$WORK/sale.json")
C_CREATED=$(json "$WORK/sale.json" 'r["verdict"]["created"]')
C=$(json "$WORK/sale.json" 'round(r["verdict"]["created"]/r["elapsed_seconds"],1)')
C_P50=$(json "$WORK/sale.json" 'round(r["latency_by_outcome"]["201"]["p50_us"]/1000,1)')
C_P99=$(json "$WORK/sale.json" 'round(r["latency_by_outcome"]["201"]["p99_us"]/1000,1)')
LG_CPU=$(json "$WORK/sale.json" 'round(r["load_generator_cpu_seconds"],2)')
C_ELAPSED=$(json "$WORK/sale.json" 'round(r["elapsed_seconds"],1)')
read -r GW_CPU PG_CPU GW_US PG_US ALL_US BUSY < <(python3 -c "
g, p, n, clk = $GW_TICKS, $PG_TICKS, $C_CREATED, $CLK_TCK
idle = $IDLE_AFTER - $IDLE_BEFORE; total = $TOTAL_AFTER - $TOTAL_BEFORE
print(f'{g/clk:.2f} {p/clk:.2f} {g/clk/n*1e6:.0f} {p/clk/n*1e6:.0f} {(g+p)/clk/n*1e6:.0f} {100*(1-idle/total):.0f}')")
# Batch sizes, and how many batches met a known key or buyer and were decided again (every
# purchase here is a new buyer's new key, so none should be).
read -r BATCH_MEAN BATCH_P99 BATCHES RECHECKED < <(python3 - "$WORK/batch_before" "$WORK/batch_after" <<'PY'
import re, sys
def rechecked(path):
    return sum(float(l.split()[-1]) for l in open(path) if l.startswith("flashgate_reservation_batches_rechecked_total"))
def parse(path):
    buckets, total, count = {}, 0.0, 0.0
    for line in open(path):
        name, value = line.rsplit(" ", 1)
        if not name.startswith("flashgate_reservation_batch_size"):
            continue
        if "_bucket{" in name:
            le = float(re.search(r'le="([^"]+)"', name).group(1).replace("+Inf", "inf"))
            buckets[le] = buckets.get(le, 0.0) + float(value)
        elif name.endswith("_sum"):
            total += float(value)
        elif name.endswith("_count"):
            count += float(value)
    return buckets, total, count
(b0, s0, c0), (b1, s1, c1) = parse(sys.argv[1]), parse(sys.argv[2])
batches = c1 - c0
p99 = next((le for le in sorted(b1) if b1[le] - b0.get(le, 0) >= 0.99 * batches), float("nan"))
again = rechecked(sys.argv[2]) - rechecked(sys.argv[1])
print(f"{(s1 - s0) / max(batches, 1):.1f} {p99:g} {batches:.0f} {again:.0f}")
PY
)
# Batches in flight on average: the time spent in reservation transactions over the run
# (their durations' sum), divided by the run's length. Exact, where sampling a gauge would
# miss batches shorter than its interval.
LANES_MEAN=$(python3 - "$WORK/batch_before" "$WORK/batch_after" "$C_ELAPSED" <<'PY'
import sys
def busy(path):
    return sum(float(l.split()[-1]) for l in open(path) if l.startswith("flashgate_reservation_transaction_seconds_sum"))
print(f"{(busy(sys.argv[2]) - busy(sys.argv[1])) / float(sys.argv[3]):.2f}")
PY
)
RATE=$(python3 -c "print(max(1, int(float('$C') / 2)))")
checkpoint
log "(c') open loop at half of (c): $RATE purchases/s, ${SECONDS_EACH}s"
sale --stock 10000000 --buckets 32 --users $((RATE * SECONDS_EACH)) --per-user-limit 1 \
    --rate "$RATE" --concurrency 2000 --duration-max-seconds "$SECONDS_EACH" \
    --out "$WORK/open.json" >"$WORK/open.txt"
OPEN_OK=$(verdict_of "$WORK/open.json")
OPEN_DONE=$(json "$WORK/open.json" 'round(r["verdict"]["created"]/r["elapsed_seconds"],1)')
OPEN_P50=$(json "$WORK/open.json" 'round(r["latency_by_outcome"]["201"]["p50_us"]/1000,1)')
OPEN_P99=$(json "$WORK/open.json" 'round(r["latency_by_outcome"]["201"]["p99_us"]/1000,1)')

# With several gateways: the per-user limit across them. Every buyer tries 10 times, each
# try on the next gateway, for a deal allowing one unit a buyer: each must hold exactly one.
LIMIT_LINE=
if [ "$GATEWAYS" -gt 1 ]; then
    log "per-user limit across $GATEWAYS gateways: 2000 buyers, 10 attempts each, limit 1"
    sale --stock 10000000 --buckets 32 --users 2000 --attempts 10 --per-user-limit 1 \
        --concurrency "$CLIENTS" --duration-max-seconds 60 --out "$WORK/limit.json" >"$WORK/limit.txt"
    LIMIT_LINE=$(json "$WORK/limit.json" '"per-user limit across %s gateways: 2000 buyers x 10 attempts, %d orders acknowledged, %d buyers hold an order, most units of one buyer %d, verdict ok=%s" % ('"$GATEWAYS"', r["verdict"]["created"], r["database"]["buyers_holding"], r["database"]["most_units_of_one_buyer"], r["verdict"]["ok"] or "; ".join(["False"] + r["verdict"]["reasons"]))')
fi

if [ "$MODE" = purchases ]; then
    [ "$GATEWAYS" = 1 ] || printf '%s gateways on one PostgreSQL and one Redis\n%s\n' "$GATEWAYS" "$LIMIT_LINE"
    cat <<TXT
(c) $C purchases/s (201 p50 ${C_P50} ms, p99 ${C_P99} ms), $C_CREATED in ${C_ELAPSED} s, verdict $C_OK, gateway: ${GW_SETTINGS% }, $GW_CAPACITY
gateway CPU ${GW_CPU} s (${GW_US} µs per purchase), PostgreSQL CPU ${PG_CPU} s (${PG_US} µs), together ${ALL_US} µs
machine busy ${BUSY} %, load generator CPU ${LG_CPU} s
batch size mean ${BATCH_MEAN}, p99 ${BATCH_P99}; batches in flight mean ${LANES_MEAN}; decided again ${RECHECKED} of ${BATCHES}
(c') open loop $RATE/s scheduled, $OPEN_DONE/s completed, 201 p50 ${OPEN_P50} ms, p99 ${OPEN_P99} ms, verdict $OPEN_OK
TXT
    [ "$FAILED_VERDICTS" = 0 ] || exit 2
    exit 0
fi

# --- a whole sale to sell-out, charted -----------------------------------------------
checkpoint
log "a sale to sell-out: 100000 units, 200000 users, $CLIENTS in flight (chart: docs/sale.svg)"
sale --stock 100000 --buckets 32 --users 200000 --per-user-limit 1 --concurrency "$CLIENTS" \
    --duration-max-seconds 120 --out "$WORK/sellout.json" --chart docs/sale.svg >"$WORK/sellout.txt"
SELLOUT=$(json "$WORK/sellout.json" '"%d orders for 100,000 units from %d requests, sold out after %s s, %.0f requests/s; database verdict: ok=%s, %s orders holding %s units, %s of %s acknowledged orders found" % (r["verdict"]["created"], r["requests"], r["sold_out_after_seconds"], r["requests_per_second"], r["verdict"]["ok"] or "; ".join(["False"] + r["verdict"]["reasons"]), r["database"]["holding_orders"], r["database"]["holding_units"], r["database"]["acknowledged_found"], r["database"]["acknowledged"])')

kill "$GW_PID" 2>/dev/null || true
refusals
flood

ratio() { python3 -c "print(f'{float($1)/float($2):.2f}')"; }
CA=$(ratio "$C" "$A"); CB=$(ratio "$C" "$B")
MACHINE="$(nproc) CPUs ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), $(free -g | awk '/Mem:/ {print $2}') GiB, $(psql_base -c 'SHOW server_version' | cut -d' ' -f1 | sed 's/^/PostgreSQL /'), synchronous_commit $(psql_base -c 'SHOW synchronous_commit')"
TABLE=$(cat <<MD
Measured $(date -u +%Y-%m-%d) by \`$COMMAND\` on $MACHINE; load generator,
gateway and PostgreSQL share the machine. $CLIENTS clients or connections, ${SECONDS_EACH} s each, every run started from a \`CHECKPOINT\` and a \`sync\`.

| | what | throughput |
|---|---|---|
| (a) | seed design, one hot row (pgbench) | $A purchases/s |
| (b) | seed design over 32 bucket rows (pgbench) | $B purchases/s |
| (c) | flashgate end to end (HTTP, JWT, limits, reservation, order; durable), ${GW_SETTINGS% } ($GW_CAPACITY) | $C purchases/s (201 p50 ${C_P50} ms, p99 ${C_P99} ms) |

| ratio | value |
|---|---|
| (c) / (a): flashgate against the hot row | $CA |
| (c) / (b): flashgate against plain buckets | $CB |

What a purchase cost in (c): $C_CREATED durable purchases in ${C_ELAPSED} s, database verdict $C_OK.

| cost | value |
|---|---|
| gateway CPU | ${GW_CPU} s, ${GW_US} µs per purchase |
| PostgreSQL CPU (its backends, WAL writer, checkpointer, background writer) | ${PG_CPU} s, ${PG_US} µs per purchase |
| gateway + PostgreSQL CPU per purchase | ${ALL_US} µs |
| machine busy (all cores, every process) | ${BUSY} % |
| load generator CPU during the run | ${LG_CPU} s |
| reservation batch size, mean / p99 (histogram bucket bound) | ${BATCH_MEAN} / ${BATCH_P99} |
| batches in flight (lanes busy), mean: time in reservation transactions / run time | ${LANES_MEAN} |
| batches decided again after meeting a known key or buyer | ${RECHECKED} of ${BATCHES} |

Open loop at half of (c): $RATE purchases/s scheduled, $OPEN_DONE/s completed, 201 p50
${OPEN_P50} ms, p99 ${OPEN_P99} ms (latency from the scheduled start), verdict $OPEN_OK.

A whole sale (100,000 units, 200,000 users, one attempt each, $CLIENTS in flight): $SELLOUT.
Throughput, p50/p99 latency and remaining stock over time: [sale.svg](sale.svg).

The load tester's runs, as run (the warm-up, (c), (c'), the whole sale):

\`\`\`sh
$(printf '%s\n' "${SALE_COMMANDS[@]}")
\`\`\`
MD
)
echo "$TABLE"
echo "$REFUSALS_TABLE"
echo "$FLOOD_TABLE"
write_block COMPARISON "$TABLE"
write_block REFUSALS "$REFUSALS_TABLE"
if [ -n "$FLOOD_SHIPPED" ]; then write_block FLOOD "$FLOOD_TABLE"; fi
log "docs/PERFORMANCE.md updated"
[ "$FAILED_VERDICTS" = 0 ] || { log "$FAILED_VERDICTS sale verdict(s) failed; see the table"; exit 2; }
