#!/usr/bin/env bash
# bench/cluster_limits.sh: what cluster-wide queue limits cost (grants,
# server/jobs_cluster.c). Three nodes on one throwaway PostgreSQL (fsync
# on, tests/pg/pg.sh), bench/loadgen's jackdaw shape (submit an echo job,
# long-poll it) on the "default" queue, a fresh database per run, ROUNDS
# interleaved rounds of: BASE's jackdawd with no limit (another tree's
# build, e.g. main's: `git archive main | tar -x -C /tmp/base && make -C
# /tmp/base all`; left out when BASE is unset), this build with no limit,
# with max_running 64 (above CONC, never binding: the grant path alone)
# and with max_running 8 (binding). Prints loadgen's line per run.
#
# Environment: JD_BUILD (build), BASE (a tree with build/jackdawd), JOBS
# (3000), CONC (32), ROUNDS (3).
# shellcheck disable=SC2119
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD=${JD_BUILD:-build}
JACKDAWD=$BUILD/jackdawd
if [ ! -x "$JACKDAWD" ] || [ ! -x "$BUILD/bench/loadgen" ]; then
    echo "cluster_limits: build first: make all $BUILD/bench/loadgen" >&2
    exit 1
fi
WORK=$(mktemp -d /tmp/jd-cluster-limits.XXXXXX)
# shellcheck source=tests/pg/pg.sh
. tests/pg/pg.sh
pg_start >/dev/null 2>&1 || { echo "pg failed"; exit 1; }
JOBS=${JOBS:-3000}
CONC=${CONC:-32}
ROUNDS=${ROUNDS:-3}
n=0
run() {
    local cfg=$1 bin=$2 pids=() addrs=() i
    n=$((n + 1))
    pg_as "$PG_BIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U jackdaw "b$n" || return
    local url="postgres://jackdaw@127.0.0.1:$PG_PORT/b$n"
    for i in 1 2 3; do
        "$bin" --db "$url" --listen 127.0.0.1:0 --plugin-dir "$(dirname "$bin")/plugins" --lease 10s 2>"$WORK/n$n.$i.log" &
        pids+=($!)
    done
    for i in 1 2 3; do
        local addr=
        for _ in $(seq 1 200); do
            addr=$(grep -o '"msg":"listening","addr":"[^"]*"' "$WORK/n$n.$i.log" | head -n 1 | cut -d'"' -f8)
            [ -n "$addr" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$addr/readyz")" = 200 ] && break
            sleep 0.05
        done
        addrs+=(--addr "$addr")
    done
    if [ "${cfg#lim}" != "$cfg" ]; then
        curl -s -o /dev/null -X PUT "http://${addrs[1]}/v1/queues/default" -H 'Content-Type: application/json' -d "{\"max_running\":${cfg#lim}}"
        grep -q '"max_running":'"${cfg#lim}" <<<"$(curl -s "http://${addrs[1]}/v1/queues/default")" || echo "PUT failed"
        sleep 1.5
    fi
    "$BUILD/bench/loadgen" --target jackdaw "${addrs[@]}" --jobs "$JOBS" --conns "$CONC" --label "$cfg" 2>&1 | grep jobs/s
    kill -TERM "${pids[@]}"
    wait "${pids[@]}" 2>/dev/null
}
for _ in $(seq 1 "$ROUNDS"); do
    [ -n "${BASE:-}" ] && run base "$BASE/build/jackdawd"
    run none "$JACKDAWD"
    run lim64 "$JACKDAWD"
    run lim8 "$JACKDAWD"
done
pg_stop
rm -rf "$WORK"
