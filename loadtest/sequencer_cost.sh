#!/usr/bin/env bash
# What giving events their feed positions costs PostgreSQL, per event: a fresh database
# migrated by DIR/flashgate gets EVENTS order events written in transactions of 24 (as
# reservation batches write them) while no sequencer runs; then a gateway from DIR starts,
# its sequencer positions the backlog (rounds of `events.sequencer_batch_max`), and the
# CPU of every PostgreSQL process from its start until the last event has its position is
# divided by the events; then a `VACUUM events`, timed on the clock, the same way (what the
# rounds left behind for vacuum). Give two directories to measure two builds, alternated
# ROUNDS times (default 2). Loopback only; the database is dropped at the end.
#
# Usage: [EVENTS=200000] [ROUNDS=2] loadtest/sequencer_cost.sh DIR [DIR2]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

EVENTS=${EVENTS:-200000}
ROUNDS=${ROUNDS:-2}
BASE_URL_DB=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
[ $# -ge 1 ] || { echo "usage: loadtest/sequencer_cost.sh DIR [DIR2]" >&2; exit 64; }
WORK=$(mktemp -d)
NAME=""
cleanup() {
    [ -n "${GW:-}" ] && kill "$GW" 2>/dev/null || true
    [ -n "$NAME" ] && psql "$BASE_URL_DB" -qc "DROP DATABASE IF EXISTS $NAME WITH (FORCE)" >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT

postgres_ticks() { # every PostgreSQL process's user + system time, in clock ticks
    local total=0 pid
    for pid in $(pgrep -u postgres); do
        total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
    done
    echo "$total"
}

waiting() { # 1 while an event waits for its position, in either schema; cheap to ask
    if [ "$(psql "$1" -Atc "SELECT to_regclass('event_positions') IS NOT NULL")" = t ]; then
        psql "$1" -Atc "SELECT count(*) FROM (SELECT 1 FROM events e, event_sequencer s
                         WHERE e.xact >= pg_snapshot_xmin(s.done)
                           AND NOT pg_visible_in_snapshot(e.xact, s.done) LIMIT 1) w"
    else
        psql "$1" -Atc "SELECT count(*) FROM (SELECT 1 FROM events WHERE position IS NULL LIMIT 1) w"
    fi
}

measure() { # $1: directory; prints "µs per event positioning, µs per event vacuum, seconds"
    NAME="fg_seq_cost_$(date +%s%N)"
    local db="${BASE_URL_DB%/*}/$NAME" secret started before after vacuumed left=1
    psql "$BASE_URL_DB" -qc "CREATE DATABASE $NAME"
    DATABASE_URL=$db "$1/flashgate" migrate >/dev/null
    psql "$db" -q <<SQL
INSERT INTO deals (id, name, stock_total, bucket_count, unit_price_minor, currency,
                   per_user_limit, reservation_ttl_seconds)
VALUES ('cost', 'Sequencer cost', 1000000000, 1, 100, 'EUR', 1, 600);
INSERT INTO inventory_buckets (deal_id, bucket, available) VALUES ('cost', 0, 1000000000);
DO \$\$ BEGIN
    FOR i IN 1..ceil($EVENTS / 24.0) LOOP
        INSERT INTO events (type, order_id, deal_id, sequence, status, user_id, quantity)
        SELECT 'order.reserved', gen_random_uuid(), 'cost', 1, 'PENDING_PAYMENT', 'u' || n, 1
          FROM generate_series(1, 24) n;
        COMMIT;
    END LOOP;
END \$\$;
CHECKPOINT;
SQL
    sync
    secret=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
    before=$(postgres_ticks)
    started=$(date +%s.%N)
    DATABASE_URL=$db FLASHGATE_LISTEN=127.0.0.1:0 FLASHGATE_OPS_LISTEN=127.0.0.1:0 RUST_LOG=warn \
        FLASHGATE_JWT_SECRET=$secret FLASHGATE_ADMIN_TOKEN=$secret \
        FLASHGATE__WAITING_ROOM__PASS_SECRET=$secret FLASHGATE__REDIS__KEY_PREFIX="seqcost$NAME:" \
        "$1/flashgate" serve >"$WORK/gateway.log" 2>&1 &
    GW=$!
    for _ in $(seq 600); do
        left=$(waiting "$db")
        [ "$left" -le 0 ] && break
        sleep 0.2
    done
    after=$(postgres_ticks)
    local seconds
    seconds=$(echo "$(date +%s.%N) - $started" | bc)
    kill "$GW"; wait "$GW" 2>/dev/null || true; GW=""
    [ "$left" -le 0 ] || { echo "sequencer_cost: $left events still waiting" >&2; exit 1; }
    # A backend's ticks leave with it, so the vacuum is timed on the clock (it runs alone).
    vacuumed=$(date +%s%N)
    psql "$db" -qc "VACUUM events"
    vacuumed=$(( ($(date +%s%N) - vacuumed) / 1000 ))
    psql "$BASE_URL_DB" -qc "DROP DATABASE $NAME WITH (FORCE)"; NAME=""
    local tick_us=$((1000000 / $(getconf CLK_TCK)))
    echo "$(( (after - before) * tick_us / EVENTS )) $(( vacuumed / EVENTS )) $seconds"
}

for round in $(seq "$ROUNDS"); do
    for dir in "$@"; do
        read -r positioning vacuum seconds < <(measure "$dir")
        echo "round $round, $dir: $EVENTS events positioned in ${seconds%???????} s;" \
             "PostgreSQL CPU $positioning µs an event, then VACUUM $vacuum µs an event (wall)"
    done
done
