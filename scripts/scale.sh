#!/usr/bin/env bash
# Private engines for the scaling tests, on loopback ports, each in its own directory:
# PgBouncer in transaction pooling mode, a three-primary Redis Cluster, and a
# pg_auto_failover formation (monitor + primary + synchronous standby). They never touch
# the shared PostgreSQL on 5432 or Redis on 6379 beyond using the former as PgBouncer's
# upstream. Missing Debian packages are installed (apt-get update once, then install),
# except under FLASHGATE_TEST_NO_SYSTEM=1 (`scripts/test.sh --no-system`), which stops
# with the list of what is missing instead.
#
# Usage:
#   scripts/scale.sh install
#   scripts/scale.sh free-port
#   scripts/scale.sh postgres start DIR PORT
#   scripts/scale.sh pgbouncer start DIR PORT [UPSTREAM_HOST UPSTREAM_PORT]
#   scripts/scale.sh redis-cluster start DIR PORT1 PORT2 PORT3
#   scripts/scale.sh pg-failover start DIR MONITOR_PORT NODE1_PORT NODE2_PORT
#   scripts/scale.sh pg-failover primary|kill-primary|switchover|wait-sync DIR
#   scripts/scale.sh stop DIR            (stops whatever `start` put in DIR)
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
log() { printf 'scale: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

PG_BIN=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1)

# Commands as an unprivileged user: PostgreSQL and PgBouncer refuse to run as root.
as_owner() {
    if [[ $(id -u) -eq 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

apt_updated=0
apt_install() {
    [[ ${FLASHGATE_TEST_NO_SYSTEM:-0} == 0 ]] ||
        die "missing $*; not installing them (FLASHGATE_TEST_NO_SYSTEM=1)"
    [[ $(id -u) -eq 0 ]] || die "installing $* needs root"
    if [[ $apt_updated -eq 0 ]]; then
        log "apt-get update"
        apt-get update -qq
        apt_updated=1
    fi
    log "apt-get install -y $*"
    apt-get install -y -qq --no-install-recommends "$@" >&2
}

install() {
    local missing=()
    command -v pgbouncer >/dev/null 2>&1 || [[ -x /usr/sbin/pgbouncer ]] || missing+=(pgbouncer)
    command -v pg_autoctl >/dev/null 2>&1 || missing+=(pg-auto-failover-cli)
    local major
    major=$(basename "$(dirname "$PG_BIN")")
    [[ -f /usr/lib/postgresql/$major/lib/pgautofailover.so ]] ||
        missing+=("postgresql-$major-auto-failover")
    command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
    if ((${#missing[@]})); then
        apt_install "${missing[@]}"
    fi
    # Debian starts a packaged pgbouncer service where it can; the tests run their own.
    log "installed: pgbouncer pg_autoctl redis-server"
}

wait_port() {
    local port=$1 seconds=$2
    local deadline=$((SECONDS + seconds))
    until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

# A loopback port nothing listens on right now, nor on the port 10000 above it (a Redis
# Cluster node's bus port), which stays below 65536.
# A port nothing listens on, below the kernel's ephemeral range together with port + 10000
# (a cluster node's bus port): a port in that range can be the local end of any outgoing
# connection of a busy test run, and binding it then fails.
free_port() {
    local port low
    read -r low _ </proc/sys/net/ipv4/ip_local_port_range
    ((low > 21000)) || die "the ephemeral port range starts too low ($low) for private services"
    while :; do
        port=$((11000 + RANDOM % (low - 21000)))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null &&
            ! (exec 3<>"/dev/tcp/127.0.0.1/$((port + 10000))") 2>/dev/null; then
            printf '%s\n' "$port"
            return 0
        fi
    done
}

own_dir() {
    mkdir -p "$1"
    [[ $(id -u) -ne 0 ]] || chown postgres "$1"
}

# A private PostgreSQL cluster with a database `test`, for a test pass that runs beside
# the others without sharing the machine's PostgreSQL and its connection limit. Nothing
# in it outlives the pass, so it skips fsync.
postgres_start() {
    local dir=$1 port=$2
    own_dir "$dir"
    as_owner "$PG_BIN/initdb" -D "$dir/data" -U postgres -A trust >"$dir/initdb.log" 2>&1 ||
        die "initdb failed (see $dir/initdb.log)"
    as_owner "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -o \
        "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300" \
        start >/dev/null || die "postgres did not start (see $dir/postgres.log)"
    printf 'postgres %s\n' "$dir/data" >>"$dir/started"
    as_owner "$PG_BIN/createdb" -h 127.0.0.1 -p "$port" -U postgres test
    log "postgres on 127.0.0.1:$port ($dir/data)"
}

pgbouncer_start() {
    local dir=$1 port=$2 upstream_host=${3:-127.0.0.1} upstream_port=${4:-5432}
    install
    own_dir "$dir"
    printf '"postgres" ""\n' >"$dir/users.txt"
    cat >"$dir/pgbouncer.ini" <<EOF
[databases]
* = host=$upstream_host port=$upstream_port
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/users.txt
pool_mode = transaction
max_client_conn = 2000
default_pool_size = 12
server_reset_query = DEALLOCATE ALL
server_reset_query_always = 1
ignore_startup_parameters = extra_float_digits,options
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
    [[ $(id -u) -ne 0 ]] || chown postgres "$dir"/*
    as_owner pgbouncer -d "$dir/pgbouncer.ini"
    wait_port "$port" 10 || die "pgbouncer did not listen on $port (see $dir/pgbouncer.log)"
    printf 'pgbouncer %s\n' "$dir/pgbouncer.pid" >>"$dir/started"
    log "pgbouncer (transaction pooling) on 127.0.0.1:$port -> $upstream_host:$upstream_port"
}

redis_cluster_start() {
    local dir=$1
    shift
    install
    mkdir -p "$dir"
    local port nodes=()
    for port in "$@"; do
        mkdir -p "$dir/$port"
        redis-server --port "$port" --bind 127.0.0.1 --daemonize yes \
            --cluster-enabled yes --cluster-config-file "$dir/$port/nodes.conf" \
            --cluster-node-timeout 2000 --save "" --appendonly no --dir "$dir/$port" \
            --pidfile "$dir/$port/redis.pid" --logfile "$dir/$port/redis.log"
        printf 'redis %s\n' "$dir/$port/redis.pid" >>"$dir/started"
        nodes+=("127.0.0.1:$port")
    done
    for port in "$@"; do
        wait_port "$port" 10 || die "redis-server did not listen on $port"
    done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >&2
    local deadline=$((SECONDS + 20))
    until redis-cli -p "$1" cluster info | grep -q 'cluster_state:ok'; do
        ((SECONDS < deadline)) || die "redis cluster did not reach state ok"
        sleep 0.2
    done
    log "redis cluster of ${#nodes[@]} primaries: ${nodes[*]}"
}

# pg_autoctl as the data directories' owner, with this machine's PostgreSQL binaries.
autoctl() {
    as_owner env PG_CONFIG="$PG_BIN/pg_config" PATH="$PG_BIN:$PATH" pg_autoctl "$@"
}

# Runs the keeper of PGDATA in the background in a process group of its own (so a test can
# kill a whole "machine": keeper and PostgreSQL) and records its pid in PGDATA.pid.
autoctl_run() {
    local dir=$1 name=$2
    local -a run=(env PG_CONFIG="$PG_BIN/pg_config" PATH="$PG_BIN:$PATH"
        pg_autoctl run --pgdata "$dir/$name")
    if [[ $(id -u) -eq 0 ]]; then
        setsid runuser -u postgres -- "${run[@]}" >"$dir/$name.log" 2>&1 </dev/null &
    else
        setsid "${run[@]}" >"$dir/$name.log" 2>&1 </dev/null &
    fi
    printf '%s\n' "$!" >"$dir/$name.pid"
}

pg_failover_start() {
    local dir=$1 monitor_port=$2 node1_port=$3 node2_port=$4
    install
    own_dir "$dir"
    local monitor="postgres://autoctl_node@127.0.0.1:$monitor_port/pg_auto_failover?sslmode=disable"
    autoctl create monitor --pgdata "$dir/monitor" --pgport "$monitor_port" \
        --hostname 127.0.0.1 --listen 127.0.0.1 --auth trust --no-ssl >"$dir/create-monitor.log" 2>&1 ||
        die "pg_autoctl create monitor failed (see $dir/create-monitor.log)"
    printf 'pg_autoctl %s\n' "$dir/monitor" >>"$dir/started"
    autoctl_run "$dir" monitor
    wait_port "$monitor_port" 30 || die "monitor did not listen on $monitor_port"
    # Fast failure detection on loopback (defaults: 5 s checks, 20 s before unhealthy, 30 s
    # before a standby replaces a primary that cannot be told to step down). Waiting less
    # loses nothing: an unreachable primary cannot commit without its synchronous standby.
    local setting
    for setting in health_check_period=1000 health_check_timeout=1000 \
        health_check_max_retries=1 health_check_retry_delay=500 \
        node_considered_unhealthy_timeout=2000 primary_demote_timeout=5000; do
        as_owner psql -X -q -h 127.0.0.1 -p "$monitor_port" -d pg_auto_failover \
            -c "ALTER SYSTEM SET pgautofailover.${setting%%=*} = ${setting#*=}" >/dev/null
    done
    as_owner psql -X -q -h 127.0.0.1 -p "$monitor_port" -d pg_auto_failover -c 'SELECT pg_reload_conf()' >/dev/null
    local name port
    for name in node1 node2; do
        port=$node1_port
        [[ $name == node1 ]] || port=$node2_port
        # The standby copies the primary, so the nodes are created one after the other.
        autoctl create postgres --pgdata "$dir/$name" --pgport "$port" --name "$name" \
            --hostname 127.0.0.1 --listen 127.0.0.1 --auth trust --no-ssl \
            --monitor "$monitor" --dbname test >"$dir/create-$name.log" 2>&1 ||
            die "pg_autoctl create postgres $name failed (see $dir/create-$name.log)"
        printf 'pg_autoctl %s\n' "$dir/$name" >>"$dir/started"
        autoctl_run "$dir" "$name"
        wait_port "$port" 60 || die "$name did not listen on $port"
        printf '%s %s\n' "$name" "$port" >>"$dir/nodes"
    done
    pg_failover_wait_sync "$dir"
    log "pg_auto_failover: monitor :$monitor_port, primary :$node1_port, synchronous standby :$node2_port"
}

# Waits until the primary has a synchronous standby, so a commit is acknowledged only once
# it is on both nodes (after start, and after a switchover before the next disruption).
pg_failover_wait_sync() {
    local dir=$1 name port deadline=$((SECONDS + 90))
    until read -r name port < <(pg_failover_primary "$dir") &&
        [[ $(as_owner psql -X -A -t -h 127.0.0.1 -p "$port" -d test \
            -c "SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')" 2>/dev/null) == 1 ]]; do
        ((SECONDS < deadline)) || die "no synchronous standby after 90 s (see $dir/*.log)"
        sleep 0.5
    done
}

# The node (name and port) that is primary now.
pg_failover_primary() {
    local dir=$1 name port
    while read -r name port; do
        if [[ $(as_owner psql -X -A -t -h 127.0.0.1 -p "$port" -d test -c 'SELECT pg_is_in_recovery()' 2>/dev/null) == f ]]; then
            printf '%s %s\n' "$name" "$port"
            return 0
        fi
    done <"$dir/nodes"
    return 1
}

# Kills the primary's whole machine at once: its keeper and PostgreSQL (SIGKILL).
pg_failover_kill_primary() {
    local dir=$1 name port
    read -r name port < <(pg_failover_primary "$dir") || die "no primary to kill"
    kill -KILL -- "-$(cat "$dir/$name.pid")"
    log "killed $name (port $port)"
    printf '%s %s\n' "$name" "$port"
}

# A planned switchover: the monitor promotes the standby once it has caught up. The
# monitor's own transaction that starts it can meet a keeper's report in a deadlock;
# PostgreSQL then rolls it back whole, so nothing has started and it is started again.
SWITCHOVER_TRIES=3
pg_failover_switchover() {
    local dir=$1 try output=$1/switchover.log
    for ((try = 1; try <= SWITCHOVER_TRIES; try++)); do
        if autoctl perform switchover --pgdata "$dir/monitor" >"$output" 2>&1; then
            cat "$output" >&2
            return 0
        fi
        cat "$output" >&2
        grep -q 'deadlock detected' "$output" || return 1
        log "the monitor met a deadlock starting the switchover (try $try of $SWITCHOVER_TRIES)"
        sleep 1
    done
    return 1
}

stop() {
    local dir=$1 kind pidfile
    [[ -f $dir/started ]] || return 0
    while read -r kind pidfile; do
        case $kind in
        postgres)
            as_owner "$PG_BIN/pg_ctl" -D "$pidfile" -m immediate -w stop >/dev/null 2>&1 || true
            ;;
        pg_autoctl)
            # Keepers restart PostgreSQL, so the keeper's whole process group goes at once.
            [[ -f $pidfile.pid ]] && kill -KILL -- "-$(cat "$pidfile.pid")" 2>/dev/null || true
            [[ -f $pidfile/postmaster.pid ]] &&
                kill -KILL "$(head -n 1 "$pidfile/postmaster.pid")" 2>/dev/null || true
            ;;
        *)
            [[ -f $pidfile ]] && kill "$(cat "$pidfile")" 2>/dev/null || true
            ;;
        esac
    done < <(tac "$dir/started")
    rm -f "$dir/started"
    log "stopped what ran in $dir"
}

case ${1:-} in
install) install ;;
free-port) free_port ;;
postgres) [[ ${2:-} == start ]] || die "usage: $0 postgres start DIR PORT"; shift 2; postgres_start "$@" ;;
pgbouncer) [[ ${2:-} == start ]] || die "usage: $0 pgbouncer start DIR PORT"; shift 2; pgbouncer_start "$@" ;;
redis-cluster) [[ ${2:-} == start ]] || die "usage: $0 redis-cluster start DIR PORTS..."; shift 2; redis_cluster_start "$@" ;;
pg-failover)
    command=${2:-}
    shift 2 || true
    case $command in
    start) pg_failover_start "$@" ;;
    primary) pg_failover_primary "$@" ;;
    kill-primary) pg_failover_kill_primary "$@" ;;
    wait-sync) pg_failover_wait_sync "$@" ;;
    switchover) pg_failover_switchover "$@" ;;
    *) die "usage: $0 pg-failover start DIR MONITOR NODE1 NODE2 | primary|kill-primary|switchover|wait-sync DIR" ;;
    esac
    ;;
stop) stop "$2" ;;
*) die "usage: $0 install | postgres start DIR PORT | pgbouncer start DIR PORT | redis-cluster start DIR PORTS... | pg-failover start DIR MONITOR NODE1 NODE2 | stop DIR" ;;
esac
