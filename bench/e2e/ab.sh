#!/usr/bin/env bash
# bench/e2e/ab.sh: interleaved A/B runs of jackdawd builds (and beanstalkd),
# for comparing CPU per job between two trees on a shared machine.
#
#   bench/e2e/ab.sh BUILD_A BUILD_B [beanstalkd]
#
# A BUILD is a directory holding jackdawd and plugins/ (a build directory,
# or a copy of one: cp -r build/jackdawd build/plugins /tmp/a/). Each run
# starts a fresh server on a fresh data directory, pushes JOBS `echo` jobs
# through build/bench/loadgen at CONC in flight (REMOTE=1: the remote-worker
# shape, CONC/16 workers claiming 32), and prints one line: jobs/s, p50/p99
# ms, the server's CPU per job (user+system from /proc/PID/stat, clock
# ticks), and per thread name the CPU per job in microseconds from
# /proc/PID/task/*/schedstat (nanoseconds: no tick quantisation).
# REMOTE=1 rows end with the workers' claim-to-complete p99 (ms).
#
# Rounds are interleaved (A B A B ...) so the machine's drift hits both. On a
# busy 2-vCPU VM the whole server's CPU per job moves 20-30 % between runs
# of one binary; per-thread ratios (a change to the HTTP path against the
# writer thread it does not touch) and medians over several rounds are what
# to read.
#
# RATE=N makes the jackdaw runs open loop (loadgen --rate N jobs/s, CONC
# connections): the tail at a given load rather than the peak.
#
# Environment: ROUNDS (5), JOBS (20000), CONC (256), SYNCS ("normal full"),
# REMOTE (unset), RATE (0: closed loop), LOADGEN (build/bench/loadgen).
set -u
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
JOBS=${JOBS:-20000}
CONC=${CONC:-256}
SYNCS=${SYNCS:-normal full}
LOADGEN=${LOADGEN:-build/bench/loadgen}
RATE=${RATE:-0}
HZ=$(getconf CLK_TCK)
[ -x "$LOADGEN" ] || {
    echo "ab.sh: build $LOADGEN first (make build/bench/loadgen)" >&2
    exit 1
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }

# per_thread PID: "name=us_per_job ..." from schedstat (first field: ns on a
# CPU), then "rq-wait=us_per_job": the second field summed over threads, the
# time they were runnable but waiting for a CPU. On this shared machine that
# wait, not the server's work, is most of a loaded run's latency.
per_thread() {
    local t
    for t in /proc/"$1"/task/*; do
        printf '%s %s\n' "$(tr ' ' _ <"$t/comm")" "$(cut -d' ' -f1,2 "$t/schedstat")"
    done 2>/dev/null | awk -v n="$JOBS" '{a[$1] += $2; w += $3} END {
        for (k in a) if (a[k] / n >= 100) printf "%s=%.1f ", k, a[k] / n / 1000
        printf "rq-wait=%.1f", w / n / 1000 }'
}

one() {
    local build=$1 sync=$2 dir port pid line c0 c1 thr
    dir=$(mktemp -d "${TMPDIR:-/tmp}/jackdaw-ab.XXXXXX")
    port=$(free_port)
    if [ "$build" = beanstalkd ]; then
        local f=50
        [ "$sync" = full ] && f=0
        beanstalkd -l 127.0.0.1 -p "$port" -b "$dir" -f "$f" 2>"$dir/log" &
        pid=$!
        sleep 0.3
        c0=$(ticks "$pid")
        line=$("$LOADGEN" --target beanstalkd --addr "127.0.0.1:$port" --jobs "$JOBS" \
            --conns "$CONC" --rate 0 --label ab --workers $((CONC > 64 ? 64 : CONC)) 2>/dev/null)
    else
        "$build/jackdawd" --listen "127.0.0.1:$port" --db "$dir/j.db" --plugin-dir "$build/plugins" \
            --sync "$sync" --max-parked 4096 --max-connections 4096 --log-level warn 2>"$dir/log" &
        pid=$!
        for _ in $(seq 100); do
            curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
            sleep 0.05
        done
        if [ -n "${REMOTE:-}" ]; then
            curl -s -o /dev/null -X PUT "http://127.0.0.1:$port/v1/commands/bench" \
                -H 'Content-Type: application/json' -d '{}'
            local w=$((CONC / 16))
            w=$((w < 1 ? 1 : w > 16 ? 16 : w))
            c0=$(ticks "$pid")
            line=$("$LOADGEN" --target jackdaw-remote --addr "127.0.0.1:$port" --jobs "$JOBS" \
                --conns "$CONC" --rate 0 --label ab --handler bench --workers "$w" --batch 32 2>/dev/null)
        else
            c0=$(ticks "$pid")
            line=$("$LOADGEN" --target jackdaw --addr "127.0.0.1:$port" --jobs "$JOBS" \
                --conns "$CONC" --rate "$RATE" --label ab --threads 1 2>/dev/null)
        fi
    fi
    c1=$(ticks "$pid")
    thr=$(per_thread "$pid")
    kill "$pid"
    wait "$pid" 2>/dev/null
    rm -rf "$dir"
    python3 - "$line" "$c0" "$c1" "$HZ" "$JOBS" "$build" "$sync" "$thr" <<'PY'
import json, sys
line, c0, c1, hz, jobs, build, sync, thr = sys.argv[1:]
try:
    l = json.loads(line)
except ValueError:
    l = {"jobs_per_s": 0, "completed": 0}
cpu = (int(c1) - int(c0)) * 1e6 / int(hz) / max(l.get("completed", 0), 1)
print(f"{sync:6} {build[-24:]:24} {l['jobs_per_s']:7.0f} j/s p50 {l.get('p50_ms', 0):6.2f} "
      f"p99 {l.get('p99_ms', 0):7.2f} cpu/job {cpu:6.1f} us | {thr}"
      + (f" | claim-to-complete p99 {l['claim_p99_ms']:.2f}" if "claim_p99_ms" in l else ""))
PY
}

open=
[ "$RATE" != 0 ] && open=", open loop at $RATE jobs/s"
echo "# $(date -u +%FT%H:%MZ) load $(cut -d' ' -f1-3 /proc/loadavg); $JOBS jobs, $CONC in flight${REMOTE:+, remote workers}$open"
for _ in $(seq "$ROUNDS"); do
    for s in $SYNCS; do
        for b in "$@"; do
            one "$b" "$s"
        done
    done
done
echo "# end $(date -u +%H:%M) load $(cut -d' ' -f1-3 /proc/loadavg)"
