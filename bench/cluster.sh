#!/usr/bin/env bash
# bench/cluster.sh (`make bench-cluster`): jobs/s and p99 of 1, 2 and 3
# jackdawd nodes on one PostgreSQL (fsync on, a throwaway server from
# tests/pg/pg.sh), beside one node on SQLite, in the same run, interleaved
# REPS times (sqlite pg1 pg2 pg3 sqlite ...) so drift hits them alike.
#
# The load is bench/loadgen's "jackdaw" shape (submit an echo job, long-poll
# it to the end, CONC connections in all), its connections spread over the
# nodes round-robin (--addr per node). Strict durability everywhere: SQLite
# --sync full, PostgreSQL fsync=on with synchronous_commit on.
#
# Per PostgreSQL row also: database writes per job (pg_stat_database deltas
# of xact_commit and tup_inserted+tup_updated+tup_deleted, read after the
# nodes stopped so every backend has flushed its counters), the WAL it
# wrote per job (pg_current_wal_insert_lsn before and after) and the
# PostgreSQL server's CPU per job (user+system of the postmaster, its live
# children and its reaped children, from /proc); for every row the nodes'
# own CPU per job. Each run gets a fresh
# database. On this 2-core machine the nodes, the server and loadgen share
# the cores: more nodes cannot add CPU, so the target for 2 and 3 nodes is
# only that throughput does not fall.
#
# Targets (issue 16): pg1 / sqlite >= 0.5 at strict durability; pg2 / pg1
# and pg3 / pg1 >= ~1.0 (not falling).
#
# Nodes sized to their share of the machine: N nodes on one machine get
# --workers max(1, cores / N) and --http-threads max(1, 2 / N) each (for
# one node that is its defaults), as an operator co-locating nodes would
# set them and as separate machines would give them; without it three
# nodes run three times the scheduler and HTTP threads on the same cores
# (SIZED=0 runs every node with its defaults, to see that cost).
#
# Runs of 30,000 jobs (3 s or so): at 10,000 a run lasted about a second,
# and each node's start (connections, the first executions' plans, its
# first claims) weighed on the ratios, the more so with more nodes.
#
# Nodes on machines of their own (MODES "capped"): co-located on these
# two cores, adding a node cannot add CPU, so the shared mode above says
# what a node costs, not whether the cluster scales out. The capped mode
# gives every node, SQLite's too, a CPU budget of its own, NODE_CPU cores
# (0.25: a cgroup CPU quota, 10 ms period, one worker and one HTTP
# thread), as if each ran on a small machine of its own beside the
# PostgreSQL server: pgN / pg1 there says whether adding nodes adds
# throughput while the nodes are the bottleneck (the reason to add them).
# It needs a writable cgroup cpu controller (v1 or v2, root); without one
# the mode is skipped with a message.
#
# Environment: JD_BUILD, JOBS (per run, 30000), CONC (64), REPS (3),
# CONFIGS (default "sqlite pg1 pg2 pg3"), LEASE (10s), SIZED (1), MODES
# ("shared capped"), NODE_CPU (0.25), OUT (results dir).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${JD_BUILD:-build}
JOBS=${JOBS:-30000}
CONC=${CONC:-64}
REPS=${REPS:-3}
CONFIGS=${CONFIGS:-sqlite pg1 pg2 pg3}
MODES=${MODES:-shared capped}
NODE_CPU=${NODE_CPU:-0.25}
if ! awk -v c="$NODE_CPU" -v n="$(nproc)" 'BEGIN {exit !(c + 0 >= 0.01 && c + 0 <= n)}' </dev/null ||
    ! [[ "$NODE_CPU" =~ ^[0-9]*\.?[0-9]+$ ]]; then
    echo "bench-cluster: NODE_CPU must be a number of cores from 0.01 to $(nproc), not '$NODE_CPU'" >&2
    exit 2
fi
OUT=${OUT:-$BUILD/bench-cluster}
LOADGEN=$BUILD/bench/loadgen
JACKDAWD=$BUILD/jackdawd
CLK_TCK=$(getconf CLK_TCK)
CORES=$(nproc)
if [ ! -x "$LOADGEN" ] || [ ! -x "$JACKDAWD" ]; then
    echo "bench-cluster: build first: make BUILD=$BUILD all $LOADGEN" >&2
    exit 1
fi
mkdir -p "$OUT"
RESULTS=$OUT/results.jsonl
: >"$RESULTS"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/jackdaw-bench-cluster.XXXXXX")
PIDS=()
CGROUPS=()
stop_nodes() {
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    PIDS=()
    for p in "${CGROUPS[@]}"; do rmdir "$p" 2>/dev/null || true; done
    CGROUPS=()
}
# shellcheck disable=SC2317 # the EXIT trap
cleanup() {
    stop_nodes
    [ -n "${CG_ROOT:-}" ] && rmdir "$CG_ROOT" 2>/dev/null
    rm -rf "$WORK"
}

# The capped mode's cgroups: CG_ROOT is a directory whose children can get
# a CPU quota (cgroup v1's cpu hierarchy, or a v2 group with the cpu
# controller enabled for its children), CG_V its version; empty: none.
CG_ROOT='' CG_V=''
cg_find() {
    local d v2
    d=$(awk '$3 == "cgroup" && $4 ~ /(^|,)cpu(,|$)/ {print $2; exit}' /proc/mounts)
    if [ -n "$d" ] && [ -w "$d" ] && mkdir -p "$d/jackdaw-bench" 2>/dev/null; then
        CG_ROOT=$d/jackdaw-bench CG_V=1
        return 0
    fi
    v2=$(awk '$3 == "cgroup2" {print $2; exit}' /proc/mounts)
    if [ -n "$v2" ] && grep -qw cpu "$v2/cgroup.controllers" 2>/dev/null &&
        mkdir -p "$v2/jackdaw-bench" 2>/dev/null &&
        echo +cpu >"$v2/cgroup.subtree_control" 2>/dev/null &&
        echo +cpu >"$v2/jackdaw-bench/cgroup.subtree_control" 2>/dev/null; then
        CG_ROOT=$v2/jackdaw-bench CG_V=2
        return 0
    fi
    return 1
}

# cg_cap PID NAME: PID (and its threads) into a new group of NODE_CPU cores.
cg_cap() {
    local g=$CG_ROOT/$2 quota
    quota=$(awk -v c="$NODE_CPU" 'BEGIN {printf "%d", c * 10000}')
    mkdir -p "$g"
    CGROUPS+=("$g")
    if [ "$CG_V" = 1 ]; then
        echo 10000 >"$g/cpu.cfs_period_us"
        echo "$quota" >"$g/cpu.cfs_quota_us"
    else
        echo "$quota 10000" >"$g/cpu.max"
    fi
    echo "$1" >"$g/cgroup.procs"
}
trap cleanup EXIT
# shellcheck source=tests/pg/pg.sh
. tests/pg/pg.sh
pg_start fsync # fsync on: strict, like --sync full
PGBASE=${PG_URL%/*}

HAVE_LEASE=0
grep -q -- '--lease' <<<"$("$JACKDAWD" --help 2>&1)" && HAVE_LEASE=1

# pg_cpu_ticks: user+system of the whole PostgreSQL server so far: the
# postmaster, its reaped children (cutime+cstime) and its live children.
pg_cpu_ticks() {
    local pm t
    pm=$(head -n1 "$PG_DIR/data/postmaster.pid")
    t=$(sed 's/.*) //' "/proc/$pm/stat" | awk '{print $12 + $13 + $14 + $15}')
    # one pass over every process: the postmaster's children
    # (a process may exit between the glob and cat: not a failure)
    t=$((t + $({ cat /proc/[0-9]*/stat 2>/dev/null || true; } | sed 's/.*) //' |
        awk -v pm="$pm" '$2 == pm {t += $12 + $13} END {print t + 0}')))
    echo "$t"
}

# nodes_cpu_ticks: user+system of the running nodes so far.
nodes_cpu_ticks() {
    local p t=0
    for p in "${PIDS[@]}"; do
        t=$((t + $(sed 's/.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
    done
    echo "$t"
}

# pg_writes DB: "xact_commit tuples_written" so far for database DB.
pg_writes() {
    pg_psql -At -F ' ' -c "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted
        FROM pg_stat_database WHERE datname = '$1'"
}

# pg_wal_lsn: the server's WAL insert position (one database runs at a time,
# so the difference over a run is that run's WAL: every row version and
# index entry a job costs, in bytes).
pg_wal_lsn() { pg_psql -At -c "SELECT pg_current_wal_insert_lsn()"; }

start_node() { # DB_URL_OR_PATH LOG [NODES]: appends to PIDS, sets ADDR
    local extra=() n=${3:-1}
    [ "$HAVE_LEASE" = 1 ] && [[ "$1" == postgres://* ]] && extra=(--lease "${LEASE:-10s}")
    if [ "$MODE" = capped ]; then
        extra+=(--workers "$(awk -v c="$NODE_CPU" 'BEGIN {w = int(c); if (w < c) w++; print w}')" --http-threads 1)
    elif [ "${SIZED:-1}" = 1 ] && [ "$n" -gt 1 ]; then
        extra+=(--workers $((CORES / n > 1 ? CORES / n : 1)) --http-threads $((2 / n > 1 ? 2 / n : 1)))
    fi
    : >"$2" # the log exists before the wait loop reads it (the node opens it in the background)
    "$JACKDAWD" --listen 127.0.0.1:0 --db "$1" --plugin-dir "$BUILD/plugins" --sync full \
        --max-parked 4096 --max-connections 4096 --log-level info "${extra[@]}" >/dev/null 2>"$2" &
    PIDS+=($!)
    [ "$MODE" = capped ] && cg_cap "$!" "node${#PIDS[@]}"
    local addr=
    for _ in $(seq 1 400); do
        addr=$(sed -n 's/.*"msg":"ready".*"addr":"\([^"]*\)".*/\1/p' "$2" | head -n1)
        [ -n "$addr" ] && break
        sleep 0.05
    done
    if [ -z "$addr" ]; then
        echo "bench-cluster: a node did not start; its log:" >&2
        tail -n 10 "$2" >&2
        exit 1
    fi
    ADDR=$addr
}

run=0
run_one() { # CONFIG
    local cfg=$1 nodes db url addrs=() line w0 w1 c0 c1 n0 n1 l0 l1 i
    run=$((run + 1))
    echo "[$MODE $cfg] run $run" >&2
    if [ "$cfg" = sqlite ]; then
        start_node "$WORK/run$run.db" "$WORK/run$run.log"
        addrs+=(--addr "$ADDR")
        n0=$(nodes_cpu_ticks)
        line=$("$LOADGEN" --target jackdaw "${addrs[@]}" --jobs "$JOBS" --conns "$CONC" --label "$cfg") || true
        n1=$(nodes_cpu_ticks)
        stop_nodes
        rm -f "$WORK/run$run".db*
        echo "{\"mode\":\"$MODE\",\"config\":\"$cfg\",\"nodes\":1,\"node_cpu_us\":$(((n1 - n0) * 1000000 / CLK_TCK)),${line#\{}" >>"$RESULTS"
        return
    fi
    nodes=${cfg#pg}
    db=bench_$run
    pg_psql -c "CREATE DATABASE $db" >/dev/null
    url=$PGBASE/$db
    # the first node creates the schema; then the others
    read -r w0 < <(pg_writes "$db" | tr ' ' ':')
    c0=$(pg_cpu_ticks)
    l0=$(pg_wal_lsn)
    for i in $(seq 1 "$nodes"); do
        start_node "$url" "$WORK/run$run.$i.log" "$nodes"
        addrs+=(--addr "$ADDR")
    done
    n0=$(nodes_cpu_ticks)
    line=$("$LOADGEN" --target jackdaw "${addrs[@]}" --jobs "$JOBS" --conns "$CONC" --label "$cfg") || true
    n1=$(nodes_cpu_ticks)
    stop_nodes
    sleep 1 # the backends' exit flushes their counters
    c1=$(pg_cpu_ticks)
    l1=$(pg_wal_lsn)
    read -r w1 < <(pg_writes "$db" | tr ' ' ':')
    local done_jobs xacts tups wal
    wal=$(pg_psql -At -c "SELECT pg_wal_lsn_diff('$l1', '$l0')::bigint")
    done_jobs=$(sed -n 's/.*"completed":\([0-9]*\).*/\1/p' <<<"$line")
    done_jobs=${done_jobs:-0}
    xacts=$((${w1%:*} - ${w0%:*}))
    tups=$((${w1#*:} - ${w0#*:}))
    echo "{\"mode\":\"$MODE\",\"config\":\"$cfg\",\"nodes\":$nodes,\"pg_xacts\":$xacts,\"pg_tuples\":$tups,\"pg_wal_bytes\":$wal,\"pg_cpu_us\":$(((c1 - c0) * 1000000 / CLK_TCK)),\"node_cpu_us\":$(((n1 - n0) * 1000000 / CLK_TCK)),${line#\{}" >>"$RESULTS"
    pg_psql -c "DROP DATABASE $db" >/dev/null
}

echo "bench-cluster: $(nproc) cores, $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ), load $(cut -d' ' -f1-3 /proc/loadavg);" \
    "$JOBS jobs a run, $CONC connections, $REPS reps of {$CONFIGS}, interleaved;" \
    "$([ "${SIZED:-1}" = 1 ] && echo "nodes sized to their share of the cores" || echo "every node with its defaults")" >&2
if [ "$HAVE_LEASE" = 0 ]; then
    echo "bench-cluster: this jackdawd has no --lease (phase 1): one node per database only" >&2
    CONFIGS=$(tr ' ' '\n' <<<"$CONFIGS" | grep -vE '^pg[2-9]$' | tr '\n' ' ')
fi
if [[ " $MODES " == *" capped "* ]] && ! cg_find; then
    echo "bench-cluster: no writable cgroup cpu controller (root, cgroup v1 cpu or v2 +cpu): the capped mode is skipped" >&2
    MODES=$(tr ' ' '\n' <<<"$MODES" | grep -vx capped | tr '\n' ' ')
fi
[[ " $MODES " == *" capped "* ]] && echo "bench-cluster: capped mode: every node in a cgroup of $NODE_CPU cores (cgroup v$CG_V)" >&2
for MODE in $MODES; do
    for _ in $(seq 1 "$REPS"); do
        for cfg in $CONFIGS; do
            run_one "$cfg"
        done
    done
done

# The tables: one a mode, medians over the reps, and the ratios.
python3 - "$RESULTS" "$NODE_CPU" <<'EOF' | tee "$OUT/table.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
med = lambda xs: statistics.median(xs) if xs else 0
titles = {"shared": "nodes sharing this machine's cores",
          "capped": f"every node capped at {sys.argv[2]} cores of its own (cgroup), as on machines of their own"}
for mode in ("shared", "capped"):
    by = {}
    for r in rows:
        if r.get("mode", "shared") == mode:
            by.setdefault(r["config"], []).append(r)
    if not by:
        continue
    print(f"### {titles[mode]}")
    print()
    print("| config | nodes | jobs/s | p99 ms | PG xacts/job | PG tuples/job | PG WAL B/job | PG CPU us/job | nodes' CPU us/job | runs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    jps = {}
    for cfg in ("sqlite", "pg1", "pg2", "pg3"):
        rs = by.get(cfg)
        if not rs:
            continue
        jps[cfg] = med([r.get("jobs_per_s", 0) for r in rs])
        p99 = med([r.get("p99_ms", 0) for r in rs])
        def per(k):
            v = [r[k] / r["completed"] for r in rs if k in r and r.get("completed")]
            return f"{med(v):.2f}" if v else "-"
        bad = sum(1 for r in rs if r.get("completed", 0) != r.get("jobs"))
        print(f"| {cfg} | {rs[0]['nodes']} | {jps[cfg]:.0f} | {p99:.1f} | {per('pg_xacts')} | "
              f"{per('pg_tuples')} | {per('pg_wal_bytes')} | {per('pg_cpu_us')} | {per('node_cpu_us')} | {len(rs)}{' (' + str(bad) + ' incomplete)' if bad else ''} |")
    print()
    def ratio(a, b, target):
        if jps.get(a) and jps.get(b):
            r = jps[a] / jps[b]
            if target is None:
                print(f"{a} / {b}: {r:.2f}x")
            else:
                print(f"{a} / {b}: {r:.2f}x (target >= {target}x){'' if r >= target else '  BELOW TARGET'}")
    ratio("pg1", "sqlite", 0.5 if mode == "shared" else None)
    ratio("pg2", "pg1", 1.0)
    ratio("pg3", "pg1", 1.0)
    print()
EOF
echo "raw results: $RESULTS" >&2
