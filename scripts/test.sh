#!/usr/bin/env bash
# Every test flashgate has: formatting, clippy (warnings are errors), and the unit and
# integration tests against a real local PostgreSQL and Redis (started if needed), the
# Prometheus alert rule tests (promtool) and, on a full run, schemathesis against a live
# gateway (scripts/schemathesis.sh).
#
# Usage: scripts/test.sh [test filter or other arguments for the test runner]
#
# Tests read DATABASE_URL and REDIS_URL; each test creates its own database from that
# base URL and uses its own Redis key prefix, so runs do not disturb one another.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\ntest: == %s\n' "$*" >&2; }

step "services"
bash scripts/services.sh
bash scripts/browser.sh

export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
printf 'test: DATABASE_URL=%s\ntest: REDIS_URL=%s\n' "$DATABASE_URL" "$REDIS_URL" >&2

step "cargo fmt --all -- --check"
cargo fmt --all -- --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

if cargo nextest --version >/dev/null 2>&1; then
    step "cargo nextest run --workspace --no-fail-fast $*"
    cargo nextest run --workspace --no-fail-fast "$@"
    # nextest does not run doctests; run them separately when there is a library.
    if [[ -f src/lib.rs ]]; then
        step "cargo test --workspace --doc"
        cargo test --workspace --doc
    fi
else
    step "cargo test --workspace --no-fail-fast $* (cargo-nextest is not installed)"
    cargo test --workspace --no-fail-fast "$@"
fi

# The oversell and payment tests again, with the gateway reaching PostgreSQL through a
# private PgBouncer 1.18 in transaction pooling mode (installed by scripts/scale.sh).
if [[ $# -eq 0 ]]; then
    step "through PgBouncer (transaction pooling): oversell and payment tests"
    pgbouncer_dir=$(mktemp -d /tmp/flashgate-pgbouncer.XXXXXX)
    pgbouncer_port=$(bash scripts/scale.sh free-port)
    trap 'bash scripts/scale.sh stop "$pgbouncer_dir"' EXIT
    bash scripts/scale.sh pgbouncer start "$pgbouncer_dir" "$pgbouncer_port"
    DATABASE_POOLER_URL="postgres://postgres@127.0.0.1:${pgbouncer_port}/test" \
        cargo nextest run --test api --no-fail-fast \
        -E 'test(/^concurrency::/) | test(/^orders::/) | test(/^payments_/) | test(/^pooled_writes::/)'
    bash scripts/scale.sh stop "$pgbouncer_dir"
    trap - EXIT
fi

# The tests of everything kept in Redis (waiting room, sold-out flags, limits) again, on a
# private three-primary Redis Cluster (REDIS_URL listing its nodes selects cluster mode).
if [[ $# -eq 0 ]]; then
    step "on a Redis Cluster: waiting-room, sold-out and limit tests"
    cluster_dir=$(mktemp -d /tmp/flashgate-redis-cluster.XXXXXX)
    cluster_ports=() cluster_urls=()
    for _ in 1 2 3; do cluster_ports+=("$(bash scripts/scale.sh free-port)"); done
    for port in "${cluster_ports[@]}"; do cluster_urls+=("redis://127.0.0.1:$port"); done
    trap 'bash scripts/scale.sh stop "$cluster_dir"' EXIT
    bash scripts/scale.sh redis-cluster start "$cluster_dir" "${cluster_ports[@]}"
    REDIS_URL=$(IFS=,; printf '%s' "${cluster_urls[*]}") \
        cargo nextest run --test api --no-fail-fast \
        -E 'test(/^waiting_room/) | test(/^global_limits::/) | test(/^rate_limits::/) | test(/sold_out/)'
    bash scripts/scale.sh stop "$cluster_dir"
    trap - EXIT
fi

# Alert rules and their unit tests (promtool comes with Debian's prometheus package).
if ! command -v promtool >/dev/null 2>&1; then
    step "installing promtool (Debian package prometheus)"
    SUDO=""
    [[ $(id -u) -eq 0 ]] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
step "promtool check rules + test rules"
promtool check rules config/prometheus/alerts.yml
promtool test rules config/prometheus/tests/*.yml

# The OpenAPI document against a live gateway (only on a full run, not for a test filter).
if [[ $# -eq 0 ]]; then
    step "schemathesis: docs/openapi.yaml against a live gateway"
    # The gateway and the payment simulator it takes payments at.
    cargo build --workspace --bins
    bash scripts/schemathesis.sh

    # Whole sales under seeded fault schedules (private PostgreSQL and Redis; about 30 s a
    # seed). A failure prints the seed and the schedule to replay it.
    step "chaos: seeded fault schedules over whole sales"
    cargo build --workspace --bins
    for seed in ${CHAOS_SEEDS:-1 2 3}; do
        target/debug/flashgate-loadtest chaos --seed "$seed" --duration-seconds 20
    done
fi

step "all checks passed"
