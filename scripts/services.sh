#!/usr/bin/env bash
# Make sure a local PostgreSQL (127.0.0.1:5432, user `postgres` without password,
# database `test`) and a local Redis (127.0.0.1:6379) are running.
#
# Meant for a Debian machine: missing packages are installed with apt-get, clusters
# are driven with pg_ctlcluster. Runs as root, or through sudo when available.
# Idempotent: when both services already answer it only checks them and returns.
#
# Usage: scripts/services.sh        (or `source scripts/services.sh`; the caller's
#                                    shell options are left untouched)

flashgate_services() (
    set -euo pipefail
    shopt -s inherit_errexit

    local PG_HOST=127.0.0.1 PG_PORT=5432 PG_DB=test
    local REDIS_HOST=127.0.0.1 REDIS_PORT=6379
    local WAIT_SECONDS=30
    export DEBIAN_FRONTEND=noninteractive PGCONNECT_TIMEOUT=3

    log() { printf 'services: %s\n' "$*" >&2; }
    die() {
        log "error: $*"
        exit 1
    }

    # Privileged commands: directly as root, otherwise through sudo (best effort).
    local -a SUDO=()
    if [[ $(id -u) -ne 0 ]]; then
        if command -v sudo >/dev/null 2>&1; then
            SUDO=(sudo)
        else
            log "not root and sudo is not available; privileged steps may fail"
        fi
    fi
    as_root() { "${SUDO[@]}" "$@"; }

    # Commands as the `postgres` OS user (peer authentication on the local socket).
    as_postgres() {
        if [[ $(id -u) -eq 0 ]]; then
            (cd / && runuser -u postgres -- "$@")
        elif [[ $(id -un) == postgres ]]; then
            "$@"
        else
            (cd / && sudo -n -u postgres -- "$@")
        fi
    }

    local apt_updated=0
    apt_install() {
        if [[ $apt_updated -eq 0 ]]; then
            log "apt-get update"
            as_root apt-get update -qq
            apt_updated=1
        fi
        log "apt-get install -y $*"
        as_root apt-get install -y -qq --no-install-recommends "$@"
    }

    # wait_until SECONDS DESCRIPTION COMMAND...: poll COMMAND until it succeeds or time runs out.
    wait_until() {
        local seconds=$1 what=$2
        shift 2
        local deadline=$((SECONDS + seconds))
        until "$@" >/dev/null 2>&1; do
            if ((SECONDS >= deadline)); then
                log "gave up waiting ${seconds}s for ${what}"
                return 1
            fi
            sleep 0.25
        done
    }

    # ---------------------------------------------------------------- PostgreSQL

    pg_binaries_present() {
        command -v pg_ctlcluster >/dev/null 2>&1 &&
            command -v pg_isready >/dev/null 2>&1 &&
            command -v psql >/dev/null 2>&1 &&
            compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null
    }

    pg_ready() { pg_isready -q -h "$PG_HOST" -p "$PG_PORT"; }

    pg_query() {
        psql -X -w -q -A -t -v ON_ERROR_STOP=1 -h "$PG_HOST" -p "$PG_PORT" -U postgres -d postgres -c "$1"
    }

    pg_login_works() { pg_query 'select 1' >/dev/null 2>&1; }

    # Newest configured cluster version; creates the `main` cluster when none exists.
    pg_cluster_version() {
        local version=""
        if [[ -d /etc/postgresql ]]; then
            version=$(find /etc/postgresql -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort -V | tail -n 1)
        fi
        if [[ -z $version || ! -d /etc/postgresql/$version/main ]]; then
            [[ -n $version ]] || version=$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort -V | tail -n 1)
            [[ -n $version ]] || die "no PostgreSQL server version found under /usr/lib/postgresql"
            log "creating PostgreSQL cluster ${version}/main on port ${PG_PORT}"
            as_root pg_createcluster --port "$PG_PORT" "$version" main >&2
        fi
        printf '%s\n' "$version"
    }

    ensure_postgres() {
        if ! pg_binaries_present; then
            log "PostgreSQL is not installed"
            apt_install postgresql
        fi

        local version
        version=$(pg_cluster_version)
        local port
        port=$(awk -v v="$version" '$1 == v && $2 == "main" { print $3 }' < <(pg_lsclusters -h 2>/dev/null) || true)
        if [[ -n $port && $port != "$PG_PORT" ]]; then
            log "warning: cluster ${version}/main is configured for port ${port}, not ${PG_PORT}"
        fi

        if pg_ready; then
            log "PostgreSQL ${version}/main is accepting connections on ${PG_HOST}:${PG_PORT}"
        else
            log "starting PostgreSQL ${version}/main"
            if ! as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start >&2; then
                log "pg_ctlcluster start returned an error (already starting?); waiting anyway"
            fi
            if ! wait_until "$WAIT_SECONDS" "PostgreSQL on ${PG_HOST}:${PG_PORT}" pg_ready; then
                as_root tail -n 30 "/var/log/postgresql/postgresql-${version}-main.log" >&2 || true
                die "PostgreSQL did not become ready"
            fi
            log "PostgreSQL is accepting connections on ${PG_HOST}:${PG_PORT}"
        fi

        if ! pg_login_works; then
            local hba marker="# flashgate: password-less local connections (development machine)"
            hba=$(as_postgres psql -X -A -t -q -p "$PG_PORT" -d postgres -c 'show hba_file' 2>/dev/null || true)
            [[ -n $hba ]] || hba=/etc/postgresql/$version/main/pg_hba.conf
            if as_root grep -qxF "$marker" "$hba"; then
                log "trust rules already present in ${hba}"
            else
                log "adding trust rules for local connections to the top of ${hba}"
                local tmp
                tmp=$(mktemp)
                {
                    printf '%s\n' "$marker" \
                        'local   all   all                  trust' \
                        'host    all   all   127.0.0.1/32   trust' \
                        'host    all   all   ::1/128        trust'
                    as_root cat "$hba"
                } >"$tmp"
                as_root cp "$tmp" "$hba"
                rm -f "$tmp"
            fi
            as_root pg_ctlcluster --skip-systemctl-redirect "$version" main reload >&2
            wait_until "$WAIT_SECONDS" "password-less login as postgres" pg_login_works ||
                die "cannot log in as postgres on ${PG_HOST}:${PG_PORT} without a password"
        fi
        log "login as postgres on ${PG_HOST}:${PG_PORT} works"

        if [[ $(pg_query "select 1 from pg_database where datname = '${PG_DB}'") != 1 ]]; then
            log "creating database ${PG_DB}"
            if ! createdb -w -h "$PG_HOST" -p "$PG_PORT" -U postgres "$PG_DB"; then
                # Another run may have created it meanwhile.
                [[ $(pg_query "select 1 from pg_database where datname = '${PG_DB}'") == 1 ]] ||
                    die "could not create database ${PG_DB}"
            fi
        fi
        log "database ${PG_DB} exists"
    }

    # --------------------------------------------------------------------- Redis

    redis_ready() {
        [[ $(timeout 3 redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" ping 2>/dev/null) == PONG ]]
    }

    redis_start() {
        as_root redis-server --daemonize yes --bind "$@" --port "$REDIS_PORT" \
            --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log >&2
    }

    ensure_redis() {
        if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
            log "Redis is not installed"
            apt_install redis-server
        fi

        if redis_ready; then
            log "Redis answers PONG on ${REDIS_HOST}:${REDIS_PORT}"
            return 0
        fi

        as_root mkdir -p /var/lib/redis /var/log/redis
        log "starting Redis on ${REDIS_HOST}:${REDIS_PORT} (and ::1 when available)"
        # redis-server forks before binding, so a bind failure only shows as no PONG.
        if ! redis_start 127.0.0.1 -::1 || ! wait_until 5 "Redis bound to 127.0.0.1 and ::1" redis_ready; then
            log "retrying with Redis bound to 127.0.0.1 only"
            redis_start 127.0.0.1 || true
            if ! wait_until "$WAIT_SECONDS" "Redis on ${REDIS_HOST}:${REDIS_PORT}" redis_ready; then
                as_root tail -n 30 /var/log/redis/ci.log >&2 || true
                die "Redis did not answer PONG"
            fi
        fi
        log "Redis answers PONG on ${REDIS_HOST}:${REDIS_PORT}"
    }

    # The demo in the README reads answers with curl and picks fields out with jq.
    ensure_demo_tools() {
        local missing=()
        command -v curl >/dev/null 2>&1 || missing+=(curl)
        command -v jq >/dev/null 2>&1 || missing+=(jq)
        if [[ ${#missing[@]} -gt 0 ]]; then
            apt_install "${missing[@]}"
        fi
    }

    # The event tests' receiver verifies deliveries with the Standard Webhooks reference
    # library (scripts/events_receiver.py), pinned here.
    ensure_webhook_verifier() {
        local wanted=standardwebhooks==1.3.0
        if python3 -c 'import standardwebhooks' >/dev/null 2>&1; then
            return
        fi
        command -v python3 >/dev/null 2>&1 || apt_install python3
        python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
        log "pip install $wanted"
        python3 -m pip install --quiet "$wanted" ||
            python3 -m pip install --quiet --break-system-packages "$wanted"
    }

    ensure_postgres
    ensure_redis
    ensure_demo_tools
    ensure_webhook_verifier
    log "ready: postgres://postgres@${PG_HOST}:${PG_PORT}/${PG_DB} redis://${REDIS_HOST}:${REDIS_PORT}"
)

if [[ ${BASH_SOURCE[0]} != "$0" ]]; then
    # Sourced: run in a subshell (the function body) and hand back its status.
    flashgate_services "$@"
else
    set -euo pipefail
    flashgate_services "$@"
fi
