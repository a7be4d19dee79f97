#!/usr/bin/env bash
# Checks docs/openapi.yaml against a live gateway with schemathesis: a fresh database, the
# payment simulator (target/debug/flashgate-psp-sim) as the gateway's provider, two deals
# (`summer-sale`, and `summer-queue` with a waiting room: the ids the document's examples
# use), orders held for review (late money on a `manual_review` deal, so the review
# operations have something to act on), an admin and a user token. Every check (`--checks
# all`), valid and invalid data (`--mode all`) and every phase, the stateful one included
# (config/schemathesis.toml): fails on any 5xx, any undocumented status code, header or
# content type, any body that does not match the document, valid data refused or invalid
# data accepted, an undocumented method not answered 405 with `Allow`, an operation that
# only ever answered 404 (`missing_test_data`), and an operation that takes an identifier
# but that the stateful phase, following the document's links, never reached with an answer
# other than 404. Each of the two runs draws its data from a fixed seed, so that a run is
# reproducible and whether the stateful phase reaches every operation does not depend on
# luck (SCHEMATHESIS_SEED_PUBLIC and SCHEMATHESIS_SEED_OPS pick others). Needs PostgreSQL and Redis (DATABASE_URL, REDIS_URL) and a built
# target/debug/flashgate and target/debug/flashgate-psp-sim (`cargo build --bins`). Installs
# schemathesis from PyPI when it is missing, unless FLASHGATE_TEST_NO_SYSTEM=1.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
# The database the fresh one is created from and dropped from: a database cannot be dropped
# over a connection to itself.
ADMIN_URL="$DATABASE_URL"
REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"

if ! command -v schemathesis >/dev/null 2>&1; then
    if [[ ${FLASHGATE_TEST_NO_SYSTEM:-0} != 0 ]]; then
        echo "schemathesis: not installed; not installing it (FLASHGATE_TEST_NO_SYSTEM=1)" >&2
        exit 1
    fi
    python3 -m pip install --quiet 'schemathesis>=4.32,<5'
fi

suffix="$$_$(date +%s)"
database="fg_schemathesis_${suffix}"
base="${DATABASE_URL%/*}"
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port=$(free_port)
ops_port=$(free_port)
log=$(mktemp)
sim_log=$(mktemp)
reports=$(mktemp -d)
server=""
sim=""

cleanup() {
    for pid in "$server" "$sim"; do
        if [[ -n "$pid" ]]; then
            kill "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    psql -q "$ADMIN_URL" -c "DROP DATABASE IF EXISTS \"$database\" WITH (FORCE)" >/dev/null 2>&1 || true
    rm -rf "$log" "$sim_log" "$reports"
}
trap cleanup EXIT

# JSON field `$1` (a Python subscript such as `["payment"]["checkout_url"]`) of stdin.
field() {
    python3 -c "import json, sys; print(json.load(sys.stdin)$1)"
}

psql -q "$ADMIN_URL" -c "CREATE DATABASE \"$database\""

export DATABASE_URL="$base/$database"
export REDIS_URL
export FLASHGATE_LISTEN="127.0.0.1:$port"
export FLASHGATE_OPS_LISTEN="127.0.0.1:$ops_port"
export FLASHGATE_ADMIN_TOKEN="schemathesis-admin-token-$suffix"
export FLASHGATE_JWT_SECRET="schemathesis-jwt-secret-$suffix"
# `serve` refuses secrets left at their development defaults or shorter than 32 bytes.
export FLASHGATE__WAITING_ROOM__PASS_SECRET="schemathesis-pass-secret-$suffix"
export FLASHGATE__REDIS__KEY_PREFIX="fgschemathesis:$suffix:"
for limit in PER_IP PER_USER PER_DEAL; do
    export "FLASHGATE__LIMITS__${limit}__RATE_PER_SECOND=100000"
    export "FLASHGATE__LIMITS__${limit}__BURST=100000"
done
# Timeouts that answer 503 under load are generous here: on a busy machine a slow Redis or
# pool is no finding of this check (outages are tested in tests/api/redis_outage.rs and
# tests/api/faults.rs).
export FLASHGATE__REDIS__COMMAND_TIMEOUT_MS=2000
export FLASHGATE__DATABASE__ACQUIRE_TIMEOUT_MS=5000
export RUST_LOG="${RUST_LOG:-warn}"
# Fresh ids for the deals schemathesis creates (see the file).
export SCHEMATHESIS_HOOKS="$PWD/scripts/schemathesis_hooks.py"

# Payments at the simulator, which sends its webhooks to this gateway. No grace after a
# reservation's expiry, so the late payments below are late at once.
sim_port=$(free_port)
# Endpoints on loopback (see scripts/schemathesis_hooks.py): deliveries stay on this machine.
export FLASHGATE__EVENTS__ALLOW_PRIVATE_TARGETS=true
export FLASHGATE__PAYMENTS__ENABLED=true
export FLASHGATE__PAYMENTS__BASE_URL="http://127.0.0.1:$sim_port"
export FLASHGATE__PAYMENTS__API_KEY="schemathesis-psp-api-key-$suffix-0123456789"
export FLASHGATE__PAYMENTS__WEBHOOK_SECRET="schemathesis-psp-webhook-secret-$suffix-0123456789"
export FLASHGATE__PAYMENTS__EXPIRY_GRACE_SECONDS=0
export FLASHGATE__PAYMENTS__OUTBOX_INTERVAL_MS=50
target/debug/flashgate-psp-sim --listen "127.0.0.1:$sim_port" \
    --webhook-url "http://127.0.0.1:$port/v1/webhooks/sim" \
    --api-key "$FLASHGATE__PAYMENTS__API_KEY" \
    --webhook-secret "$FLASHGATE__PAYMENTS__WEBHOOK_SECRET" >"$sim_log" 2>&1 &
sim=$!

target/debug/flashgate serve >"$log" 2>&1 &
server=$!
for _ in $(seq 1 100); do
    if curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; then
        break
    fi
    sleep 0.2
done
curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null || { cat "$log"; exit 1; }
curl -fsS "http://127.0.0.1:$sim_port/control/webhook_url" >/dev/null || { cat "$sim_log"; exit 1; }

curl -fsS -X POST "http://127.0.0.1:$ops_port/admin/deals" \
    -H "Authorization: Bearer $FLASHGATE_ADMIN_TOKEN" -H 'Content-Type: application/json' \
    -d '{"id": "summer-sale", "name": "Summer sale", "stock": 1000000, "buckets": 8,
         "unit_price_minor": 1999, "currency": "EUR", "per_user_limit": 1000000,
         "reservation_ttl_seconds": 600}' >/dev/null
curl -fsS -X POST "http://127.0.0.1:$ops_port/admin/deals" \
    -H "Authorization: Bearer $FLASHGATE_ADMIN_TOKEN" -H 'Content-Type: application/json' \
    -d '{"id": "summer-queue", "name": "Summer sale with a line", "stock": 1000000,
         "buckets": 8, "unit_price_minor": 1999, "currency": "EUR", "per_user_limit": 1000000,
         "reservation_ttl_seconds": 600,
         "waiting_room": {"admit_per_second": 1000, "max_active": 100000}}' >/dev/null
FLASHGATE_USER_TOKEN=$(target/debug/flashgate token --user schemathesis --ttl-seconds 3600)
export FLASHGATE_USER_TOKEN

# Orders held for review: each reserves a unit of `late-sale` for a second, expires, and
# then the simulator takes the money anyway.
curl -fsS -X POST "http://127.0.0.1:$ops_port/admin/deals" \
    -H "Authorization: Bearer $FLASHGATE_ADMIN_TOKEN" -H 'Content-Type: application/json' \
    -d '{"id": "late-sale", "name": "Late payments", "stock": 100, "buckets": 1,
         "unit_price_minor": 1999, "currency": "EUR", "per_user_limit": 1,
         "reservation_ttl_seconds": 1, "late_payment_policy": "manual_review"}' >/dev/null
review_orders=()
intents=()
for i in $(seq 1 10); do
    token=$(target/debug/flashgate token --user "late-payer-$i" --ttl-seconds 3600)
    order=$(curl -fsS -X POST "http://127.0.0.1:$port/v1/deals/late-sale/orders" \
        -H "Authorization: Bearer $token" -H "Idempotency-Key: late-$i" \
        -H 'Content-Type: application/json' -d '{"quantity": 1}')
    review_orders+=("$(field '["order_id"]' <<<"$order") $token")
    intent=$(field '["payment"]["checkout_url"].rsplit("/", 1)[-1]' <<<"$order")
    intents+=("$intent")
done
# Waits until the order `$1` (with the user token `$2`) reads `$3`.
wait_status() {
    for _ in $(seq 1 150); do
        status=$(curl -fsS "http://127.0.0.1:$port/v1/orders/$1" -H "Authorization: Bearer $2" |
            field '["status"]')
        [[ "$status" == "$3" ]] && return 0
        sleep 0.2
    done
    echo "schemathesis: order $1 never $3 (it is $status)" >&2
    return 1
}
for i in "${!review_orders[@]}"; do
    read -r order_id token <<<"${review_orders[$i]}"
    wait_status "$order_id" "$token" EXPIRED
    curl -fsS -X POST "http://127.0.0.1:$sim_port/control/payment_intents/${intents[$i]}/succeed" >/dev/null
    wait_status "$order_id" "$token" MANUAL_REVIEW
done

# One worker: with two, hypothesis parses lambda sources in both threads at once, which
# Python 3.11 can fail with "AST constructor recursion depth mismatch" (a runtime error of
# the tool, not a finding).
# The public API against the public listener, then the operator paths (/metrics, /admin/*)
# against the operations listener, where they are served.
operator_paths='^/(metrics|admin/)'
seed_public=${SCHEMATHESIS_SEED_PUBLIC:-207281503035420374182160963589696240515}
seed_ops=${SCHEMATHESIS_SEED_OPS:-310668880705729108537009673362461296356}
status=0
timeout "${SCHEMATHESIS_TIMEOUT_SECONDS:-240}" \
    schemathesis --config-file config/schemathesis.toml run docs/openapi.yaml \
    --url "http://127.0.0.1:$port" --workers "${SCHEMATHESIS_WORKERS:-1}" \
    --checks all --mode all --seed "$seed_public" \
    --report ndjson --report-ndjson-path "$reports/public.ndjson" \
    --exclude-path-regex "$operator_paths" "$@" || status=$?
if [[ $status -eq 0 ]]; then
    python3 scripts/stateful_reach.py docs/openapi.yaml "$reports/public.ndjson" \
        exclude "$operator_paths" || status=$?
fi
if [[ $status -eq 0 ]]; then
    timeout "${SCHEMATHESIS_TIMEOUT_SECONDS:-240}" \
        schemathesis --config-file config/schemathesis.toml run docs/openapi.yaml \
        --url "http://127.0.0.1:$ops_port" --workers "${SCHEMATHESIS_WORKERS:-1}" \
        --checks all --mode all --seed "$seed_ops" \
        --report ndjson --report-ndjson-path "$reports/ops.ndjson" \
        --include-path-regex "$operator_paths" "$@" || status=$?
fi
if [[ $status -eq 0 ]]; then
    python3 scripts/stateful_reach.py docs/openapi.yaml "$reports/ops.ndjson" \
        include "$operator_paths" || status=$?
fi
if [[ $status -ne 0 ]]; then
    echo "schemathesis: failed ($status); gateway log:" >&2
    tail -n 50 "$log" >&2
fi
exit $status
