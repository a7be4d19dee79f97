#!/usr/bin/env bash
# Checks docs/openapi.yaml against a live gateway with schemathesis: a fresh database, two
# deals (`summer-sale`, and `summer-queue` with a waiting room: the ids the document's
# examples use), an admin and a user token. Every check (`--checks all`), valid and invalid
# data (`--mode all`) and every phase, the stateful one included (config/schemathesis.toml):
# fails on any 5xx, any undocumented status code, header or content type, any body that
# does not match the document, valid data refused or invalid data accepted, and an
# undocumented method not answered 405 with `Allow`. Needs PostgreSQL and Redis
# (DATABASE_URL, REDIS_URL) and a built target/debug/flashgate. Installs schemathesis from
# PyPI when it is missing, unless FLASHGATE_TEST_NO_SYSTEM=1.
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
server=""

cleanup() {
    if [[ -n "$server" ]]; then
        kill "$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
    fi
    psql -q "$ADMIN_URL" -c "DROP DATABASE IF EXISTS \"$database\" WITH (FORCE)" >/dev/null 2>&1 || true
    rm -f "$log"
}
trap cleanup EXIT

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

target/debug/flashgate serve >"$log" 2>&1 &
server=$!
for _ in $(seq 1 100); do
    if curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; then
        break
    fi
    sleep 0.2
done
curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null || { cat "$log"; exit 1; }

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

# One worker: with two, hypothesis parses lambda sources in both threads at once, which
# Python 3.11 can fail with "AST constructor recursion depth mismatch" (a runtime error of
# the tool, not a finding).
# The public API against the public listener, then the operator paths (/metrics, /admin/*)
# against the operations listener, where they are served.
operator_paths='^/(metrics|admin/)'
status=0
timeout "${SCHEMATHESIS_TIMEOUT_SECONDS:-240}" \
    schemathesis --config-file config/schemathesis.toml run docs/openapi.yaml \
    --url "http://127.0.0.1:$port" --workers "${SCHEMATHESIS_WORKERS:-1}" \
    --checks all --mode all \
    --exclude-path-regex "$operator_paths" "$@" || status=$?
if [[ $status -eq 0 ]]; then
    timeout "${SCHEMATHESIS_TIMEOUT_SECONDS:-240}" \
        schemathesis --config-file config/schemathesis.toml run docs/openapi.yaml \
        --url "http://127.0.0.1:$ops_port" --workers "${SCHEMATHESIS_WORKERS:-1}" \
        --checks all --mode all \
        --include-path-regex "$operator_paths" "$@" || status=$?
fi
if [[ $status -ne 0 ]]; then
    echo "schemathesis: failed ($status); gateway log:" >&2
    tail -n 50 "$log" >&2
fi
exit $status
