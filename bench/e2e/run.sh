#!/usr/bin/env bash
# bench/e2e/run.sh (`make bench-e2e`): the same no-op jobs through Jackdaw,
# beanstalkd and BullMQ on redis-server, on this machine, in one run,
# interleaved (A B C A B C ...) so drift hits every system alike. Each run
# starts its server on a fresh data directory on loopback and stops it after.
#
# "jackdaw" is a job's whole life per connection (submit, long-poll to the
# end, echo plugin); "jackdaw-remote" is beanstalkd's shape over the task
# routes: producers submit jobs of a remote command, C/16 (1..16) workers
# claim up to 32 tasks each and end them with one POST /v1/tasks/complete.
# "jackdaw-wait" is "jackdaw" in one request a
# job: POST /v1/jobs?wait=30s answers with the finished job.
#
# Durability levels compared:
#   strict   jackdawd --sync full | beanstalkd -b DIR -f 0 | redis appendfsync always
#   relaxed  jackdawd --sync normal | beanstalkd -b DIR -f 50 | redis appendfsync everysec
# Closed loop at each concurrency in CONCS (jobs in flight = connections for
# Jackdaw, producers for beanstalkd, worker concurrency for BullMQ), REPS
# times; then an open-loop run of each system at half its own peak for the
# latency target (for jackdaw-remote also claim-to-complete: the worker's
# p50/p99 from the claim's answer to the complete's, and the bucket of the
# server's jackdaw_task_claim_to_end_seconds that holds the run's p99).
# Prints one table of medians and the ratios (peak against peak, and
# remote against beanstalkd run by run within each round, median over
# rounds), with the server's CPU (user+system from /proc) per completed job
# for every row.
#
# Environment: JD_BUILD (build dir), JOBS (per run, default 30000),
# CONCS (default "16 64 256"), REPS (default 3), DURABILITY (default
# "strict relaxed"), SYSTEMS (default "jackdaw jackdaw-wait
# jackdaw-remote beanstalkd bullmq"),
# JD_WORKERS (jackdawd --workers, default: one per core), OUT (results dir).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${JD_BUILD:-build}
JOBS=${JOBS:-30000}
CONCS=${CONCS:-16 64 256}
REPS=${REPS:-3}
DURABILITY=${DURABILITY:-strict relaxed}
SYSTEMS=${SYSTEMS:-jackdaw jackdaw-wait jackdaw-remote beanstalkd bullmq}
OUT=${OUT:-$BUILD/bench-e2e}
LOADGEN=$BUILD/bench/loadgen
JACKDAWD=$BUILD/jackdawd

CLK_TCK=$(getconf CLK_TCK)
mkdir -p "$OUT"
RESULTS=$OUT/results.jsonl
: >"$RESULTS"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/jackdaw-e2e.XXXXXX")
SERVER_PID=
cleanup() {
    [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

# ---- what the peers need: Debian's beanstalkd and redis-server, npm's bullmq ----
case " $SYSTEMS " in *" beanstalkd "*) tools/deps.sh beanstalkd ;; esac
case " $SYSTEMS " in *" bullmq "*) tools/deps.sh redis-server ;; esac
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    tools/deps.sh nodejs npm
fi
if [[ " $SYSTEMS " == *" bullmq "* ]] && [ ! -d bench/e2e/node_modules/bullmq ]; then
    echo "bench-e2e: installing bullmq with npm into bench/e2e/node_modules" >&2
    (cd bench/e2e && npm install --no-audit --no-fund --no-package-lock --loglevel=error >&2)
fi
if [ ! -x "$LOADGEN" ] || [ ! -x "$JACKDAWD" ]; then
    echo "bench-e2e: build first: make BUILD=$BUILD all $LOADGEN" >&2
    exit 1
fi

free_port() {
    node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}

peak_rss_kb() {
    awk '/^VmHWM:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0
}

# cpu_ticks PID: the process's user+system CPU so far, in clock ticks
# (/proc/PID/stat fields 14 and 15; the command name may hold spaces, so
# count from the last ')').
cpu_ticks() {
    sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | awk '{print $12 + $13}' || echo 0
}

# thread_cpu_json PID: {"name": microseconds, ...}, the CPU each of the
# process's named threads used so far, summed by name (Jackdaw names its
# threads: jd-writer, jd-done, MHD-worker, ...), for the per-layer split.
thread_cpu_json() {
    local t
    for t in /proc/"$1"/task/*; do
        printf '%s %s\n' "$(tr ' ' _ <"$t/comm")" "$(sed 's/.*) //' "$t/stat" | awk '{print $12 + $13}')"
    done 2>/dev/null | awk -v hz="$CLK_TCK" 'NF == 2 {a[$1] += $2}
        END {s = ""; for (k in a) s = s sprintf("%s\"%s\":%d", s == "" ? "" : ",", k, a[k] * 1000000 / hz); print "{" s "}"}'
}

wait_port() { # port: wait until something accepts on it
    for _ in $(seq 1 200); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
            return 0
        fi
        sleep 0.05
    done
    return 1
}

stop_server() {
    if [ -n "$SERVER_PID" ]; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 1 100); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=
    fi
}

# start_<system> DURABILITY DIR: starts the server, sets SERVER_PID and PORT.
start_jackdaw() {
    local sync=full
    [ "$1" = relaxed ] && sync=normal
    PORT=$(free_port)
    "$JACKDAWD" --listen "127.0.0.1:$PORT" --db "$2/jackdaw.db" --plugin-dir "$BUILD/plugins" \
        --sync "$sync" ${JD_WORKERS:+--workers "$JD_WORKERS"} --max-parked 4096 \
        --max-connections 4096 --log-level warn 2>"$2/server.log" &
    SERVER_PID=$!
    wait_port "$PORT"
}
start_jackdaw-wait() { start_jackdaw "$@"; }
start_jackdaw-remote() {
    start_jackdaw "$@" || return 1
    curl -s -o /dev/null -X PUT "http://127.0.0.1:$PORT/v1/commands/bench" \
        -H 'Content-Type: application/json' -d '{}'
}
start_beanstalkd() {
    local f=0
    [ "$1" = relaxed ] && f=50
    PORT=$(free_port)
    beanstalkd -l 127.0.0.1 -p "$PORT" -b "$2" -f "$f" 2>"$2/server.log" &
    SERVER_PID=$!
    wait_port "$PORT"
}
start_bullmq() {
    local fsync=always
    [ "$1" = relaxed ] && fsync=everysec
    PORT=$(free_port)
    redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly yes \
        --appendfsync "$fsync" --dir "$2" --daemonize no --maxmemory-policy noeviction \
        >"$2/server.log" 2>&1 &
    SERVER_PID=$!
    wait_port "$PORT"
}

# claim_hist: the server's claim-to-end histogram of command "bench" from
# /metrics, as "le count" lines (cumulative counts), then "sum SECONDS".
claim_hist() {
    curl -s "http://127.0.0.1:$PORT/metrics" | awk '
        /^jackdaw_task_claim_to_end_seconds_bucket\{command="bench"/ {
            match($0, /le="[^"]*"/); print substr($0, RSTART + 4, RLENGTH - 5), $NF }
        /^jackdaw_task_claim_to_end_seconds_sum\{command="bench"/ { print "sum", $NF }'
}

# claim_hist_json BEFORE AFTER: the run's share of the histogram (after minus
# before) as JSON fields: tasks ended, mean ms, and the bucket bounds (ms)
# that hold the p50 and p99 (the server counts whole milliseconds in buckets
# of 10, 50, 100, 500 ms, ...: a bound, not a value).
claim_hist_json() {
    paste -d' ' <(echo "$1") <(echo "$2") | awk '
        $1 == "sum" { sum = $4 - $2; next }
        { le[n] = $1; c[n++] = $4 - $2 }
        END {
            tot = n ? c[n - 1] : 0
            for (i = 0; i < n; i++) {
                if (p50 == "" && c[i] >= 0.50 * tot) p50 = le[i]
                if (p99 == "" && c[i] >= 0.99 * tot) p99 = le[i]
            }
            b50 = p50 == "+Inf" ? -1 : p50 * 1000; b99 = p99 == "+Inf" ? -1 : p99 * 1000
            printf "\"server_claim_tasks\":%d,\"server_claim_mean_ms\":%.2f,", tot, tot ? sum * 1000 / tot : 0
            printf "\"server_claim_p50_le_ms\":%g,\"server_claim_p99_le_ms\":%g,", b50, b99
        }'
}

# run_one SYSTEM DURABILITY CONC RATE: one measured run; appends a JSON line.
# ROUND (the closed-loop repetition, 1..REPS) goes into the line, so the
# table can take ratios of runs from the same round.
run_one() {
    local sys=$1 dur=$2 conc=$3 rate=$4 dir line rss cpu0 cpu1 threads hist0= hist=
    echo "[$dur c=$conc rate=$rate] $sys" >&2
    dir=$(mktemp -d "$WORK/$sys.XXXX")
    "start_$sys" "$dur" "$dir" || {
        echo "bench-e2e: $sys did not start; log:" >&2
        cat "$dir/server.log" >&2
        exit 1
    }
    local common=(--jobs "$JOBS" --conns "$conc" --rate "$rate" --label "$sys")
    [ "$sys" = jackdaw-remote ] && hist0=$(claim_hist)
    cpu0=$(cpu_ticks "$SERVER_PID")
    case $sys in
    jackdaw) line=$("$LOADGEN" --target jackdaw --addr "127.0.0.1:$PORT" "${common[@]}" --threads 1) || true ;;
    jackdaw-wait) line=$("$LOADGEN" --target jackdaw --submit-wait --addr "127.0.0.1:$PORT" "${common[@]}" --threads 1) || true ;;
    jackdaw-remote)
        local w=$((conc / 16))
        w=$((w < 1 ? 1 : w > 16 ? 16 : w))
        line=$("$LOADGEN" --target jackdaw-remote --addr "127.0.0.1:$PORT" "${common[@]}" \
            --handler bench --workers "$w" --batch 32) || true
        ;;
    beanstalkd) line=$("$LOADGEN" --target beanstalkd --addr "127.0.0.1:$PORT" "${common[@]}" --workers "$((conc > 64 ? 64 : conc))") || true ;;
    bullmq) line=$(node bench/e2e/bullmq.mjs --port "$PORT" "${common[@]}") || true ;;
    esac
    cpu1=$(cpu_ticks "$SERVER_PID")
    [ "$sys" = jackdaw-remote ] && hist=$(claim_hist_json "$hist0" "$(claim_hist)")
    rss=$(peak_rss_kb "$SERVER_PID")
    threads=$(thread_cpu_json "$SERVER_PID")
    stop_server
    if [ -z "$line" ]; then
        echo "bench-e2e: $sys $dur c=$conc produced no result; server log:" >&2
        tail -n 20 "$dir/server.log" >&2
        line='{"completed":0,"jobs_per_s":0}'
    fi
    # Server CPU for the whole run (the server process only: for BullMQ that
    # is redis-server, its node workers are the client's).
    line="{\"system\":\"$sys\",\"durability\":\"$dur\",\"round\":${ROUND:-0},$hist\"server_rss_kb\":$rss,\"server_cpu_us\":$(((cpu1 - cpu0) * 1000000 / CLK_TCK)),\"server_threads_cpu_us\":$threads,${line#\{}"
    echo "$line" >>"$RESULTS"
    echo "  $line" >&2
    rm -rf "$dir"
}

echo "bench-e2e: $(nproc) cores, $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ); $JOBS jobs a run," \
    "concurrency {$CONCS}, $REPS reps, interleaved" >&2
for dur in $DURABILITY; do
    for conc in $CONCS; do
        for ROUND in $(seq 1 "$REPS"); do
            for sys in $SYSTEMS; do
                run_one "$sys" "$dur" "$conc" 0
            done
        done
    done
done

# Half of each system's peak (median over reps of its best concurrency), open loop.
for dur in $DURABILITY; do
    for sys in $SYSTEMS; do
        read -r peak conc < <(node bench/e2e/table.mjs --peak "$sys" "$dur" <"$RESULTS")
        [ "${peak:-0}" -gt 0 ] || continue
        rate=$((peak / 2))
        ROUND=0
        # At least 5 s of load; twice the peak's concurrency leaves room for queueing.
        JOBS=$((rate * 5 > JOBS ? rate * 5 : JOBS)) run_one "$sys" "$dur" $((conc * 2)) "$rate"
    done
done

node bench/e2e/table.mjs <"$RESULTS" | tee "$OUT/table.md"
echo "raw results: $RESULTS" >&2
