# A throwaway PostgreSQL server for tests and benchmarks (source this file).
#
#   . tests/pg/pg.sh
#   pg_start [fsync]   # sets PG_URL (postgres://jackdaw@127.0.0.1:PORT/jackdaw),
#                      # PG_DIR, PG_PORT, PG_BIN; stops by itself when the shell exits;
#                      # PG_OPTS="-c name=value ..." adds server settings (measurements:
#                      # pg_stat_statements, WAL settings; see docs/performance.md)
#   pg_psql -c 'SELECT 1'
#   pg_stop            # immediate stop, directory removed (also run at exit)
#
# For the integration scripts (after tests/integration/lib.sh):
#   pg_test_start [KILL]  # pg_start nofsync, or one failed TAP line and exit;
#                         # on exit KILL (default kill_nodes: SIGKILL every
#                         # node in NODES), pg_stop, lib.sh's cleanup
#   sql 'SELECT ...'      # one statement's rows, unaligned
#
# Debian keeps the server binaries off PATH (/usr/lib/postgresql/<v>/bin), and
# initdb/postgres refuse to run as root, so as root the server runs as the
# package's `postgres` user in a directory it owns. It listens on 127.0.0.1
# only, on a free port, with its socket in its own directory, so the
# package's cluster on 5432 (if any) is left alone. fsync stays on unless the
# caller passes "nofsync" (for tests where durability is not what is tested).

pg_bin_dir() {
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1
}

pg_free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# Run a command as the server's user (postgres when we are root).
pg_as() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

pg_start() {
    PG_BIN=$(pg_bin_dir)
    if [ -z "$PG_BIN" ] || [ ! -x "$PG_BIN/initdb" ]; then
        echo "pg.sh: no PostgreSQL server binaries (apt-get install postgresql)" >&2
        return 1
    fi
    PG_DIR=$(mktemp -d /tmp/jd-pg-XXXXXX)
    chmod 755 "$PG_DIR"
    [ "$(id -u)" = 0 ] && chown postgres: "$PG_DIR"
    local extra=""
    [ "${1:-}" = nofsync ] && extra="-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    extra="$extra ${PG_OPTS:-}"
    if ! pg_as "$PG_BIN/initdb" -D "$PG_DIR/data" -A trust -U jackdaw --no-sync -E UTF8 \
        >"$PG_DIR/initdb.log" 2>&1; then
        echo "pg.sh: initdb failed:" >&2
        cat "$PG_DIR/initdb.log" >&2
        return 1
    fi
    local try
    for try in 1 2 3 4 5; do
        PG_PORT=$(pg_free_port)
        if pg_as "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w -t 30 \
            -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_DIR -c max_connections=200 $extra" \
            start >/dev/null 2>&1; then
            break
        fi
        PG_PORT=""
    done
    if [ -z "$PG_PORT" ]; then
        echo "pg.sh: the server did not start:" >&2
        tail -20 "$PG_DIR/log" >&2
        return 1
    fi
    # Stop with the shell, before whatever EXIT trap the caller already has.
    local prev
    prev=$(trap -p EXIT | sed -e "s/^trap -- '//" -e "s/' EXIT\$//")
    trap "pg_stop; $prev" EXIT
    pg_as "$PG_BIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U jackdaw jackdaw || return 1
    PG_URL="postgres://jackdaw@127.0.0.1:$PG_PORT/jackdaw"
    export PG_URL PG_DIR PG_PORT PG_BIN
}

pg_psql() {
    psql -X -q -v ON_ERROR_STOP=1 "$PG_URL" "$@"
}

pg_stop() {
    if [ -n "${PG_DIR:-}" ] && [ -d "$PG_DIR/data" ]; then
        pg_as "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate -w stop >/dev/null 2>&1
    fi
    [ -n "${PG_DIR:-}" ] && rm -rf "$PG_DIR"
    PG_DIR=""
}

# pg_node NAME FLAGS...: a jackdawd node on PG_URL (integration scripts:
# lib.sh's JACKDAWD, BUILD, WORK), its log in $WORK/node.NAME.log, ready
# when it returns 0; sets BASE_NAME and PID_NAME and appends the pid to
# NODES. FLAGS must include --listen.
pg_node() {
    local n=$1 log=$WORK/node.$1.log addr=
    shift
    : >"$log"
    "$JACKDAWD" --db "$PG_URL" --plugin-dir "$BUILD/plugins" "$@" 2>"$log" &
    local pid=$!
    NODES+=("$pid")
    for _ in $(seq 1 200); do
        addr=$(grep -o '"msg":"listening","addr":"[^"]*"' "$log" | head -n 1 | cut -d'"' -f8)
        [ -n "$addr" ] && break
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.05
    done
    printf -v "BASE_$n" '%s' "http://$addr"
    printf -v "PID_$n" '%s' "$pid"
    for _ in $(seq 1 200); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$addr/readyz")" = 200 ] && return 0
        sleep 0.05
    done
    notok "node $n becomes ready" "$(tail -n 5 "$log")"
    return 1
}

# SIGKILL every node an integration script started (NODES, from pg_node).
kill_nodes() {
    local p
    for p in "${NODES[@]}"; do kill -KILL "$p" 2>/dev/null; done
}

sql() { pg_psql -At -c "$1"; }

pg_test_start() {
    if ! pg_start nofsync; then
        notok "a throwaway PostgreSQL starts (tests/pg/pg.sh)"
        finish
        exit 1
    fi
    # shellcheck disable=SC2064 # the kill function is chosen now
    trap "${1:-kill_nodes}; pg_stop; cleanup" EXIT
}
