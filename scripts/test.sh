#!/usr/bin/env bash
# Every test flashgate has: formatting, clippy (warnings are errors), the unit and
# integration tests against a real local PostgreSQL and Redis (started if needed) in two
# tiers, the oversell and payment tests again through PgBouncer, the Redis tests again on a
# Redis Cluster, the Prometheus alert rule tests (promtool), schemathesis against a live
# gateway and seeded chaos runs.
#
# Usage: scripts/test.sh [--no-system] [--plan] [--yes] [test filter or runner arguments]
#
#   --no-system  change nothing outside the repository (also FLASHGATE_TEST_NO_SYSTEM=1):
#                no apt-get, no pip, no pg_hba.conf edits, no services started. PostgreSQL
#                and Redis must already run; steps and tests whose tools are missing are
#                skipped, each named with what it needs.
#   --plan       print the steps and the changes to this machine they would make, and exit.
#   --yes        do not ask before changing the machine (never asked without a terminal).
#
# On a full run (no filter) the machine may be changed before the tests start; the plan is
# printed first, and on a terminal the script waits for Enter. A filter (for example
# `scripts/test.sh reservation`) runs only the matching tests after fmt, clippy and the build.
#
# Everything is compiled once, by the build step (every target and, for the tests, the
# `flashgate`, `flashgate-loadtest` and `flashgate-psp-sim` binaries), through clippy's
# compiler, which is also the lint; every later step selects the same packages so cargo has
# nothing left to build. Each step's time is printed at the end.
#
# A full run overlaps what waits: the steps mostly wait on timers, PostgreSQL and child
# processes, not on the cores. After the build, the chaos seeds with
# schemathesis (private PostgreSQL and Redis, one gateway on the shared ones) run alongside
# the tests, each with its log in target/steps/; both tiers run in one nextest run (four at
# a time, MAIN_PASS_THREADS), then the PgBouncer pass and the Redis Cluster pass side by
# side. Each pass has a private PostgreSQL (initdb, fsync off, 300 connections), so their
# connections never meet the machine's PostgreSQL's limit (100). A failure does not stop
# the steps after it: every verdict is awaited, the logs of failed steps are printed, and
# the run fails at the end.
#
# Tests read DATABASE_URL and REDIS_URL; each test creates its own database from that
# base URL and uses its own Redis key prefix, so runs do not disturb one another.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

no_system=${FLASHGATE_TEST_NO_SYSTEM:-0}
[[ $no_system == 0 || -z $no_system ]] && no_system=0 || no_system=1
plan_only=0
assume_yes=0
while [[ $# -gt 0 ]]; do
    case $1 in
    --no-system) no_system=1 ;;
    --plan) plan_only=1 ;;
    --yes) assume_yes=1 ;;
    --) shift; break ;;
    *) break ;;
    esac
    shift
done
full_run=0
[[ $# -gt 0 ]] || full_run=1

export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
# Tests at once in a full run's main pass, on its private PostgreSQL (max_connections 300):
# more would only share the two cores thinner.
MAIN_PASS_THREADS=${MAIN_PASS_THREADS:-4}
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
# Private engines (scripts/scale.sh) read this and refuse to install packages.
export FLASHGATE_TEST_NO_SYSTEM=$no_system

# Scratch space for what the tests start and throw away (private PostgreSQL clusters and
# Redis servers, browser profiles, the chaos runs' engines), on a tmpfs when the machine has
# one with room: every test creates and drops a database, and on a disk file system that
# file work is a third of PostgreSQL's CPU in a full run. Removed at the end.
scratch_base() {
    local avail_kb
    avail_kb=$(df --output=avail -k /dev/shm 2>/dev/null | tail -n 1 | tr -d ' ')
    if [[ -w /dev/shm && ${avail_kb:-0} -gt 4194304 ]]; then
        printf '/dev/shm\n'
    else
        printf '%s\n' "${TMPDIR:-/tmp}"
    fi
}

step() { printf '\ntest: == %s\n' "$*" >&2; }
note() { printf 'test: %s\n' "$*" >&2; }

# ------------------------------------------------------------------ step timings

step_names=()
step_seconds=()
current_step=""
step_started=0

# begin NAME: closes the step before (recording its time) and announces NAME.
begin() {
    finish_step
    current_step=$1
    step_started=$SECONDS
    step "$1"
}

finish_step() {
    if [[ -n $current_step ]]; then
        step_names+=("$current_step")
        step_seconds+=($((SECONDS - step_started)))
        current_step=""
    fi
}

print_timings() {
    local status=$?
    # A step may fail before the helpers below are defined.
    ! declare -F stop_alongside >/dev/null || stop_alongside
    [[ -z ${main_dir:-} ]] || bash scripts/scale.sh stop "$main_dir" 2>/dev/null
    [[ -z ${SCRATCH:-} ]] || rm -rf "$SCRATCH"
    finish_step
    ((${#step_names[@]})) || return "$status"
    printf '\ntest: step times (%s)\n' "$([[ $status -eq 0 ]] && echo "all passed" || echo "stopped by a failure")" >&2
    local i
    for i in "${!step_names[@]}"; do
        printf 'test: %6ss  %s\n' "${step_seconds[$i]}" "${step_names[$i]}" >&2
    done
    printf 'test: %6ss  total (wall clock; steps marked "alongside" overlap the others)\n' "$SECONDS" >&2
    return "$status"
}

# ------------------------------------------------------------------ what is missing

have() { command -v "$1" >/dev/null 2>&1; }
have_browser() { [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; }
have_pgbouncer() { have pgbouncer || [[ -x /usr/sbin/pgbouncer ]]; }
have_pg_auto_failover() {
    have pg_autoctl && compgen -G '/usr/lib/postgresql/*/lib/pgautofailover.so' >/dev/null
}
have_nextest() { cargo nextest --version >/dev/null 2>&1; }

# Installs Debian packages as root or through sudo, reading the package lists first only
# when they do not know the package yet (a fresh machine has none).
apt_install() {
    local sudo=()
    [[ $(id -u) -eq 0 ]] || sudo=(sudo)
    local install=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@")
    "${install[@]}" >/dev/null 2>&1 || { "${sudo[@]}" apt-get update -qq && "${install[@]}" >/dev/null; }
}

# The changes a full run would make to this machine now, one per line (none: empty).
machine_changes() {
    local apt=()
    compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || apt+=(postgresql)
    have redis-server || apt+=(redis-server)
    have curl || apt+=(curl)
    have jq || apt+=(jq)
    have_browser || apt+=(chromium chromium-driver fonts-dejavu-core)
    have node && have npm || apt+=(nodejs npm)
    if ((full_run)); then
        have_pgbouncer || apt+=(pgbouncer)
        have_pg_auto_failover || apt+=(pg-auto-failover-cli "postgresql-<version>-auto-failover")
    fi
    have promtool || apt+=(prometheus)
    if ((full_run)) && ! have mold; then apt+=(mold); fi
    ((${#apt[@]} == 0)) || printf 'apt-get install (as root or through sudo): %s\n' "${apt[*]}"
    if ! python3 -c 'import opentelemetry.proto, prometheus_client' 2>/dev/null; then
        printf "pip install opentelemetry-proto==1.27.0 prometheus-client==0.21.1 (python3 -m pip, for the tracing tests: scripts/otlp.sh)\n"
    fi
    python3 -c 'import standardwebhooks' >/dev/null 2>&1 ||
        printf "pip install 'standardwebhooks==1.3.0' (python3 -m pip; the event tests' receiver)\n"
    if ((full_run)) && ! have schemathesis; then
        printf "pip install 'schemathesis>=4.32,<5' (python3 -m pip, for this user or system-wide)\n"
    fi
    if ! psql -X -w -q -h 127.0.0.1 -p 5432 -U postgres -d postgres -c 'select 1' >/dev/null 2>&1; then
        printf '%s\n' "PostgreSQL on 127.0.0.1:5432 does not answer a password-less login as postgres yet:" \
            "  a cluster may be created and started (pg_createcluster, pg_ctlcluster), and" \
            "  'trust' rules for local connections added at the top of its pg_hba.conf"
    fi
    if ! [[ $(timeout 3 redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null) == PONG ]]; then
        printf 'redis-server started on 127.0.0.1:6379 (no persistence, log /var/log/redis/ci.log)\n'
    fi
}

# What stays the same however the machine looks: private processes, removed afterwards.
private_engines() {
    ((full_run)) || return 0
    ((skip_pgbouncer)) || printf 'a private PgBouncer and PostgreSQL on free loopback ports, stopped afterwards\n'
    printf '%s\n' \
        "a private three-node Redis Cluster and a PostgreSQL on free loopback ports, stopped afterwards" \
        "private PostgreSQL (initdb) and redis-server instances for outage, failover and chaos tests" \
        "all of them in a scratch folder, on /dev/shm when it is a tmpfs with room, removed afterwards" \
        "databases fg_* and Redis keys fgtest:* on the shared services, dropped by the tests that made them"
}

# ------------------------------------------------------------------ the plan

# With --no-system, what cannot run because a tool is missing: nextest filters of tests
# (`skipped_tests`) and what is skipped, said once in the plan (`skipped_reasons`).
skipped_tests=()
skipped_reasons=()
skip_pgbouncer=0 skip_promtool=0 skip_schemathesis=0
decide_skips() {
    ((no_system)) || return 0
    if ! { have node && have npm; }; then
        skipped_tests+=('test(/^oidc::/)')
        skipped_reasons+=("oidc tests (need node and npm: scripts/oidc.sh)")
    fi
    if ! have_browser; then
        skipped_tests+=('test(/^waiting_room_page/)')
        skipped_reasons+=("waiting_room_page tests (need /usr/bin/chromium and /usr/bin/chromedriver: scripts/browser.sh)")
    fi
    if ! have_pg_auto_failover; then
        skipped_tests+=('test(/^failover::/)')
        skipped_reasons+=("failover tests (need pg_autoctl and pg_auto_failover: scripts/scale.sh install)")
    fi
    if ((full_run)) && ! have_pgbouncer; then
        skip_pgbouncer=1
        skipped_reasons+=("the PgBouncer pass (needs pgbouncer: scripts/scale.sh install)")
    fi
    if ! python3 -c 'import opentelemetry.proto, prometheus_client' 2>/dev/null; then
        skipped_tests+=('test(/^traces::/)')
        skipped_reasons+=("traces tests (need opentelemetry-proto and prometheus-client: scripts/otlp.sh)")
    fi
    if [[ ! -x edge/cloudflare/node_modules/.bin/workerd ]]; then
        skipped_tests+=('test(/^edge_worker::/)')
        skipped_reasons+=("edge_worker tests (need workerd: scripts/edge.sh runs npm ci in edge/cloudflare)")
    fi
    if ! have promtool; then
        skip_promtool=1
        skipped_reasons+=("promtool check/test rules (needs Debian's prometheus package)")
    fi
    if ((full_run)) && ! have schemathesis; then
        skip_schemathesis=1
        skipped_reasons+=("schemathesis (needs the schemathesis command: pip install 'schemathesis>=4.32,<5')")
    fi
}

print_plan() {
    local changes
    changes=$(machine_changes)
    printf 'test: plan\n'
    if ((no_system)); then
        printf 'test:   --no-system: nothing outside the repository is changed; missing tools skip what needs them\n'
        local reason
        for reason in "${skipped_reasons[@]}"; do printf 'test:     skipped: %s\n' "$reason"; done
    elif [[ -n $changes ]]; then
        printf 'test:   changes to this machine first (scripts/services.sh, scripts/browser.sh, scripts/scale.sh):\n'
        printf '%s\n' "$changes" | sed 's/^/test:     - /'
    else
        printf 'test:   nothing to install or configure: every tool is present and the services answer\n'
    fi
    printf '%s\n' "$(private_engines)" | sed '/^$/d; s/^/test:   - /'
    printf 'test:   steps: %s\n' "$(planned_steps "$@")"
    printf 'test:   how long each step takes on 2 cores: README.md, "How long things take"\n'
}

planned_steps() {
    local steps=()
    if ((no_system)); then steps+=("check services"); else steps+=(services); fi
    steps+=(fmt)
    if ! have_nextest; then
        steps+=(clippy "cargo test ${*:-(all)}")
    elif ((full_run)); then
        local side="chaos seeds ${CHAOS_SEEDS:-1 2 3}" passes="Redis Cluster pass"
        ((skip_schemathesis)) || side+=" then schemathesis"
        ((skip_pgbouncer)) || passes="PgBouncer pass and $passes"
        steps+=("build once with clippy" "alongside the tests: $side"
            "both tiers at once" "$passes side by side")
    else
        steps+=("build once with clippy" "tests matching: $*")
    fi
    ((skip_promtool)) || steps+=(promtool)
    local IFS=,
    printf '%s' "${steps[*]}" | sed 's/,/, /g'
}

confirm() {
    ((no_system || assume_yes)) && return 0
    [[ -t 0 && -z ${CI:-} ]] || return 0
    [[ -n $(machine_changes) ]] || return 0
    printf 'test: press Enter to go on, or Ctrl-C to stop (scripts/test.sh --no-system changes nothing) ' >&2
    read -r _
}

decide_skips
print_plan "$@" >&2
((plan_only)) && exit 0
confirm
SCRATCH=$(mktemp -d "$(scratch_base)/flashgate-test.XXXXXX")
# Private engines run as the postgres user in folders of their own beneath it.
chmod 0711 "$SCRATCH"
export TMPDIR=$SCRATCH
trap print_timings EXIT

# ------------------------------------------------------------------ services

if ((no_system)); then
    begin "check services (--no-system: nothing is installed or started)"
    have psql && have redis-cli ||
        { note "psql and redis-cli are needed to check the services; run without --no-system to install them"; exit 1; }
    psql -X -w -q "$DATABASE_URL" -c 'select 1' >/dev/null ||
        { note "PostgreSQL does not answer at $DATABASE_URL; start it or run without --no-system"; exit 1; }
    # A Redis Cluster's URL lists its nodes; its first node is asked.
    [[ $(timeout 3 redis-cli -u "${REDIS_URL%%,*}" ping 2>/dev/null) == PONG ]] ||
        { note "Redis does not answer at $REDIS_URL; start it or run without --no-system"; exit 1; }
else
    begin "services"
    bash scripts/services.sh
    bash scripts/browser.sh
    bash scripts/edge.sh
    bash scripts/otlp.sh
fi
begin "the OpenID Connect provider for the provider-token tests (npm ci in tests/oidc)"
if ((no_system)); then
    bash scripts/oidc.sh --no-system || note "skipped: the oidc tests need node and npm"
else
    bash scripts/oidc.sh
fi
printf 'test: DATABASE_URL=%s\ntest: REDIS_URL=%s\n' "$DATABASE_URL" "$REDIS_URL" >&2

# ------------------------------------------------------------------ build once

begin "cargo fmt --all -- --check"
cargo fmt --all -- --check

# ------------------------------------------------------------------ clippy

# Clippy lints while the build compiles: clippy-driver, the compiler clippy runs, compiles
# the workspace's own crates (RUSTC_WORKSPACE_WRAPPER; dependencies go to rustc as usual)
# and denies warnings, so the one build is also the lint and no second, check-mode build
# of every dependency competes with the tests for the cores. Every later step runs with
# the same environment, so cargo finds nothing to rebuild. Without cargo-nextest, clippy
# runs on its own before `cargo test`.
clippy_command=(cargo clippy --workspace --all-targets --target-dir target/clippy -- -D warnings)

# Links with mold when it is installed (Debian package mold, installed on a full run that
# may change the machine): GNU ld spends seconds on each large test binary.
fast_linker() {
    if ! have mold && ((full_run && !no_system)); then
        apt_install mold || note "mold could not be installed; linking with the default linker"
    fi
    if have mold; then
        export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C link-arg=-fuse-ld=mold"
    fi
}

lint_while_building() {
    local driver
    driver=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver || true)
    [[ -x $driver ]] ||
        { note "clippy-driver was not found: rustup component add clippy"; exit 1; }
    export RUSTC_WORKSPACE_WRAPPER=$driver
    # cargo clippy's own way of handing arguments to the driver.
    export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
}

# Steps that run alongside the tests: `alongside NAME FUNCTION` runs FUNCTION in a
# subshell of its own, its output in target/steps/<n>.log and its own time recorded;
# `await_alongside` waits for each at the end, records its time as a step marked
# "alongside", and fails the run (printing the log) when it failed.
alongside_names=()
alongside_pids=()
alongside_logs=()

alongside() {
    local name=$1 function=$2
    local log
    log=target/steps/$((${#alongside_names[@]} + 1)).log
    mkdir -p target/steps
    note "alongside the tests: $name (log: $log)"
    (
        started=$SECONDS
        status=0
        "$function" >"$log" 2>&1 || status=$?
        printf '%s\n' "$((SECONDS - started))" >"$log.seconds"
        exit "$status"
    ) &
    alongside_names+=("$name")
    alongside_pids+=($!)
    alongside_logs+=("$log")
}

await_alongside() {
    local i status failed=0
    for i in "${!alongside_pids[@]}"; do
        begin "waiting for: ${alongside_names[$i]}"
        status=0
        wait "${alongside_pids[$i]}" || status=$?
        alongside_pids[i]=""
        finish_step
        step_names+=("${alongside_names[$i]} (alongside)")
        step_seconds+=("$(cat "${alongside_logs[$i]}.seconds" 2>/dev/null || echo '?')")
        if ((status != 0)); then
            tail -n 300 "${alongside_logs[$i]}" >&2
            note "failed: ${alongside_names[$i]} (whole log: ${alongside_logs[$i]})"
            failed=1
        fi
    done
    return "$failed"
}

# A run stopped early does not leave steps running behind it; each cleans up its private
# engines on its way out.
stop_alongside() {
    local pid
    for pid in "${alongside_pids[@]}"; do
        [[ -z $pid ]] || stop_tree "$pid"
    done
}

# Stops a process and everything it started, children first.
stop_tree() {
    local child
    for child in $(pgrep -P "$1" 2>/dev/null); do stop_tree "$child"; done
    kill "$1" 2>/dev/null || true
}

# The tests skipped for a missing tool, as one filterset term (`all()` when none is).
# Several -E arguments are a union in nextest, so every filter is combined with it in one.
kept_tests() {
    ((${#skipped_tests[@]})) || { printf 'all()'; return; }
    local IFS='|'
    printf 'not (%s)' "${skipped_tests[*]}"
}
kept=$(kept_tests)
# Set by a failed step that does not stop the run; the run fails at the end.
failed=0

# Every nextest step selects `--workspace`, as the build step does, so cargo resolves the
# same features and has nothing to compile again.
nextest() { cargo nextest run --workspace --no-fail-fast "$@"; }

# Starts a private PostgreSQL in DIR for a pass beside the main one and prints its port:
# the shared one's connection limit is the main pass's.
private_postgres() {
    local dir=$1 port
    port=$(bash scripts/scale.sh free-port)
    bash scripts/scale.sh postgres start "$dir" "$port" >&2
    printf '%s\n' "$port"
}

# The oversell and payment tests again, with the gateway reaching PostgreSQL through a
# private PgBouncer 1.18 in transaction pooling mode (installed by scripts/scale.sh) in
# front of a private PostgreSQL. Not the payments soak: it sends the statements of the
# other payment tests, only longer (35 s and two slots), and concurrency through the
# pooler is what `concurrency::` tests. Runs in a subshell of its own (`alongside`), which
# stops both on its way out.
pgbouncer_pass() {
    pgbouncer_dir=$(mktemp -d "$SCRATCH/flashgate-pgbouncer.XXXXXX")
    trap 'bash scripts/scale.sh stop "$pgbouncer_dir"' EXIT
    trap 'exit 143' TERM
    local postgres_port port
    postgres_port=$(private_postgres "$pgbouncer_dir")
    port=$(bash scripts/scale.sh free-port)
    bash scripts/scale.sh pgbouncer start "$pgbouncer_dir" "$port" 127.0.0.1 "$postgres_port"
    DATABASE_URL="postgres://postgres@127.0.0.1:${postgres_port}/test" \
        DATABASE_POOLER_URL="postgres://postgres@127.0.0.1:${port}/test" nextest --test-threads 2 -E \
        "$kept & binary_id(flashgate::api) & (test(/^concurrency::/) | test(/^orders::/) | test(/^payments_/) | test(/^pooled_writes::/)) & not test(/^payments_soak::/)"
}

# The tests of everything kept in Redis (waiting room, sold-out flags, limits) again, on a
# private three-primary Redis Cluster (REDIS_URL listing its nodes selects cluster mode)
# and a private PostgreSQL. Not these, whose scripts and keys the others here run on the
# cluster already: the idle test (it starts a Redis of its own, so it never reads
# REDIS_URL), the crowds (5,000 users in one flash sale, ten times the stock in another, a
# quarter polling from far back: scale and command counts, not key placement), three
# gateway processes sharing a 200/s line (it measures the rate, which three processes
# beside the PgBouncer pass starve of the cores), and the waiting pages (a browser's part
# of the line, whose Redis side the others cover). Runs in a subshell of its own (`alongside`), which stops the cluster and
# PostgreSQL on its way out.
redis_cluster_pass() {
    cluster_dir=$(mktemp -d "$SCRATCH/flashgate-redis-cluster.XXXXXX")
    trap 'bash scripts/scale.sh stop "$cluster_dir"' EXIT
    trap 'exit 143' TERM
    local ports=() urls=() port postgres_port
    postgres_port=$(private_postgres "$cluster_dir")
    for _ in 1 2 3; do ports+=("$(bash scripts/scale.sh free-port)"); done
    for port in "${ports[@]}"; do urls+=("redis://127.0.0.1:$port"); done
    bash scripts/scale.sh redis-cluster start "$cluster_dir" "${ports[@]}"
    DATABASE_URL="postgres://postgres@127.0.0.1:${postgres_port}/test" \
        REDIS_URL=$(IFS=,; printf '%s' "${urls[*]}") nextest --test-threads 2 -E \
        "$kept & binary_id(flashgate::api) & (test(/^waiting_room/) | test(/^global_limits::/) | test(/^rate_limits::/) | test(/sold_out/)) \
         & not (test(/^waiting_room_idle::/) | test(/^waiting_room_multi::flash_sale/) | test(/^waiting_room_edge::a_crowd/) \
                | test(/^waiting_room_multi::three_processes/) | test(/^waiting_room_crowd::/) | test(/^waiting_room_page/))"
}


# Whole sales under seeded fault schedules (private PostgreSQL and Redis; about 30 s a
# seed): one line per seed, its report and its log under target/chaos/; a failure shows
# the end of its log, with the seed and the command to replay it. Then the OpenAPI
# document against a live gateway, with the binary the build step made.
chaos_and_schemathesis() {
    local seed
    mkdir -p target/chaos
    for seed in ${CHAOS_SEEDS:-1 2 3}; do
        target/debug/flashgate-loadtest chaos --seed "$seed" --duration-seconds 20 \
            --out "target/chaos/seed-$seed.json" 2>"target/chaos/seed-$seed.log" ||
            { tail -n 30 "target/chaos/seed-$seed.log"; return 1; }
    done
    if ((skip_schemathesis)); then
        note "skipped: schemathesis (needs the schemathesis command: pip install 'schemathesis>=4.32,<5')"
    else
        note "schemathesis: docs/openapi.yaml against a live gateway"
        bash scripts/schemathesis.sh
    fi
}

if ! have_nextest; then
    # Without cargo-nextest: one `cargo test` run, then the alert rules.
    begin "cargo clippy --workspace --all-targets -- -D warnings"
    "${clippy_command[@]}"
    begin "cargo test --workspace --no-fail-fast $* (cargo-nextest is not installed)"
    note "without cargo-nextest there are no tiers and no PgBouncer, Redis Cluster, schemathesis"
    note "or chaos pass: cargo install cargo-nextest --locked"
    cargo test --workspace --no-fail-fast "$@"
    full_run=0
else
    begin "build and clippy: cargo nextest run --workspace --all-targets --no-run"
    note "building every target (benches included) and, for the tests, the flashgate,"
    note "flashgate-loadtest and flashgate-psp-sim binaries, once, through clippy-driver"
    note "(warnings are errors; its time: README.md, \"How long things take\")"
    lint_while_building
    fast_linker
    cargo nextest run --workspace --all-targets --no-run
    # Cargo builds a package's binaries for its integration tests; schemathesis and chaos
    # run them from here rather than build them again with another feature set.
    for binary in flashgate flashgate-loadtest flashgate-psp-sim; do
        [[ -x target/debug/$binary ]] ||
            { note "target/debug/$binary was not built: its package needs an integration test"; exit 1; }
    done

    if ((full_run)); then
        alongside "chaos: seeded fault schedules over whole sales (seeds ${CHAOS_SEEDS:-1 2 3}), then schemathesis" \
            chaos_and_schemathesis
        # Both tiers in one run, the slowest tests first (.config/nextest.toml, profile all),
        # on a private PostgreSQL (MAIN_PASS_THREADS at a time): the pass is mostly tests
        # waiting on timers and child processes.
        begin "both tiers at once: unit, in-process and process-starting tests (profile all)"
        main_dir=$(mktemp -d "$SCRATCH/flashgate-main-pass.XXXXXX")
        main_port=$(private_postgres "$main_dir")
        DATABASE_URL="postgres://postgres@127.0.0.1:${main_port}/test" \
            nextest --profile all --test-threads "$MAIN_PASS_THREADS" -E "$kept" || failed=1
        bash scripts/scale.sh stop "$main_dir"
        main_dir=""
        # Then the PgBouncer and Redis Cluster passes side by side, two tests at a time
        # each on a PostgreSQL of their own: beside the main pass they would starve its
        # timed tests of the two cores.
        if ((skip_pgbouncer)); then
            note "skipped: the PgBouncer pass (needs pgbouncer: scripts/scale.sh install)"
        else
            alongside "through PgBouncer (transaction pooling): oversell and payment tests" pgbouncer_pass
        fi
        alongside "on a Redis Cluster: waiting-room, sold-out and limit tests" redis_cluster_pass
    else
        begin "cargo nextest run --workspace $*"
        nextest -E "$kept" "$@"
    fi

    # No doctest step: no crate has a doc example (its examples are tests), so
    # `cargo test --doc` would compile the crates once more to run none.
fi

# Alert rules and their unit tests (promtool comes with Debian's prometheus package).
if ((skip_promtool)); then
    note "skipped: promtool check/test rules (needs Debian's prometheus package)"
else
    if ! have promtool; then
        begin "installing promtool (Debian package prometheus)"
        apt_install prometheus
    fi
    begin "promtool check rules + test rules"
    promtool check rules config/prometheus/alerts.yml
    promtool test rules config/prometheus/tests/*.yml
fi

await_alongside || failed=1
((failed == 0)) || { note "a step failed (above)"; exit 1; }
finish_step
step "all checks passed"
