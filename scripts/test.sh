#!/usr/bin/env bash
# Every test flashgate has: formatting, clippy (warnings are errors), and the unit and
# integration tests against a real local PostgreSQL and Redis (started if needed).
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

step "all checks passed"
