#!/usr/bin/env bash
# Start local PostgreSQL and Redis if needed (scripts/services.sh), build flashgate in
# release mode and serve a demo sale, with the commands to try it printed last (among
# them the DATABASE_URL the operator CLI needs to see the demo's deal).
#
# Usage: scripts/demo.sh [--reset] [arguments for `flashgate demo`, e.g. --config file.toml]
#
#   --reset  start over: drop the demo's database and Redis keys first, so the demo deal
#            has all its seats again (a rerun otherwise keeps what earlier runs sold).
#
# The demo keeps its own state apart from the tests': the database flashgate_demo on the
# local PostgreSQL and Redis keys under flashgate-demo:. The gateway's logs go to
# target/demo/flashgate.log, so they do not scroll the instructions away.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

DEMO_DATABASE=flashgate_demo
DEMO_KEY_PREFIX=flashgate-demo:
SERVER_URL=postgres://postgres@127.0.0.1:5432
LOG=target/demo/flashgate.log

say() { printf 'demo: %s\n' "$*" >&2; }

reset=0
args=()
for arg in "$@"; do
    case $arg in
    --reset) reset=1 ;;
    *) args+=("$arg") ;;
    esac
done

bash scripts/services.sh

psql_server() { psql -X -w -q -A -t -v ON_ERROR_STOP=1 "$SERVER_URL/postgres" -c "$1"; }

if ((reset)); then
    say "--reset: dropping database $DEMO_DATABASE and Redis keys ${DEMO_KEY_PREFIX}*"
    psql_server "DROP DATABASE IF EXISTS $DEMO_DATABASE WITH (FORCE)" >/dev/null
    redis-cli -h 127.0.0.1 -p 6379 --scan --pattern "${DEMO_KEY_PREFIX}*" |
        xargs -r redis-cli -h 127.0.0.1 -p 6379 del >/dev/null
fi
if [[ $(psql_server "SELECT 1 FROM pg_database WHERE datname = '$DEMO_DATABASE'") != 1 ]]; then
    say "creating database $DEMO_DATABASE"
    psql_server "CREATE DATABASE $DEMO_DATABASE" >/dev/null
fi

if [[ -x target/release/flashgate ]]; then
    say "building flashgate (release; only what changed since the last build)"
else
    say "building flashgate in release mode, minutes the first time (README.md, \"How long things take\")"
fi
cargo build --release --bin flashgate

mkdir -p "$(dirname "$LOG")"
: >"$LOG"
say "gateway logs: $LOG (follow them with: tail -f $LOG)"
export DATABASE_URL="$SERVER_URL/$DEMO_DATABASE"
export FLASHGATE__REDIS__KEY_PREFIX="$DEMO_KEY_PREFIX"
status=0
target/release/flashgate demo "${args[@]}" 2>>"$LOG" || status=$?
if [[ $status -ne 0 ]]; then
    say "flashgate demo stopped with status $status; the end of its log:"
    tail -n 20 "$LOG" >&2
    exit "$status"
fi
say "stopped"
