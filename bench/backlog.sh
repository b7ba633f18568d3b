#!/usr/bin/env bash
# bench/backlog.sh (`make bench-backlog`): what a large backlog of queued
# jobs costs the server. One jackdawd on a fresh data directory; the queue
# "backlog" is paused, then N echo jobs (~130 bytes of args each,
# priorities 0-3 in turn) are submitted to it through POST /v1/jobs/batch
# (1000 a request, 2 requests in flight). The server runs with its default
# --queue-window (1000), so all but the next jobs wait in the store.
# Printed, from the same run:
#
#   idle RSS              the fresh server before any job: the baseline
#   RSS with N queued     after the last batch committed (and its ratio to idle)
#   restart until ready   SIGTERM, start again on the same database, time
#                         from exec to the first 200 from /readyz
#   RSS after restart     with the N jobs recovered and still queued
#   drain                 resume the queue; time until it has no queued or
#                         running job, as jobs per second
#   RSS after drain       1 s after the queue emptied (and its ratio to idle)
#   priority order        from the database after the drain: jobs that
#                         started more than 50 ms before the last start of
#                         a higher priority (0 when the drain kept the
#                         order), and the same for the baseline
#   baseline drain        the normal rate: a fresh server with
#                         --queue-window 0 (every queued job in memory, as
#                         before the window) drains min(N, 50000) the same way
#                         (not more: with mixed priorities an all-in-memory
#                         ready list is O(n) per insert, so a larger
#                         baseline takes minutes to submit); both with the
#                         server's CPU per job during the drain (utime+stime
#                         from /proc), which a busy machine disturbs less
#                         than the wall-clock rate
#   same, w default       min(N, 50000) again with the default window,
#                         restarted before its drain like the N run: the
#                         ratio of the N run to it is what the larger
#                         database costs; its own ratio to the baseline is
#                         what the window and the restart cost
#
# RSS is VmRSS from /proc/PID/status. Environment: JD_BUILD (build dir),
# N (jobs, default 200000; `make bench-backlog BIG=1` runs 1000000),
# SYNC (jackdawd --sync, default full), ARGS (more jackdawd flags),
# BASE_N (the baseline's jobs, default min(N, 50000); 0 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${JD_BUILD:-build}
N=${N:-200000}
SYNC=${SYNC:-full}
EXTRA=${ARGS:-}
JACKDAWD=$BUILD/jackdawd
Q=backlog
PER=1000

if [ ! -x "$JACKDAWD" ]; then
    echo "bench-backlog: build first: make BUILD=$BUILD all" >&2
    exit 1
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/jackdaw-backlog.XXXXXX")
PID=
cleanup() {
    if [ -n "$PID" ]; then
        kill -KILL "$PID" 2>/dev/null
        wait "$PID" 2>/dev/null
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$PID/status"; }
mib() { awk -v k="$1" 'BEGIN {printf "%.1f MiB", k / 1024}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2fx", a / b}'; }
now_ns() { date +%s%N; }

# start: exec jackdawd, wait for its address, then for /readyz; sets PID,
# BASE and READY_MS (exec to the first 200).
START=0
start() {
    START=$((START + 1))
    local log=$WORK/server.$START.log t0 addr=
    : >"$log"
    t0=$(now_ns)
    # shellcheck disable=SC2086
    "$JACKDAWD" --listen 127.0.0.1:0 --db "$WORK/${DBNAME:-jd}.db" --plugin-dir "$BUILD/plugins" \
        --sync "$SYNC" $EXTRA "$@" 2>"$log" &
    PID=$!
    for _ in $(seq 1 6000); do
        addr=$(grep -o '"msg":"listening","addr":"[^"]*"' "$log" | head -n 1 | cut -d'"' -f8 || true)
        [ -n "$addr" ] && break
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.005
    done
    if [ -z "$addr" ]; then
        echo "bench-backlog: jackdawd did not start:" >&2
        tail -n 5 "$log" >&2
        exit 1
    fi
    BASE=http://$addr
    until [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/readyz")" = 200 ]; do
        kill -0 "$PID" 2>/dev/null || {
            tail -n 5 "$log" >&2
            exit 1
        }
        sleep 0.005
    done
    READY_MS=$((($(now_ns) - t0) / 1000000))
}

stop() {
    kill -TERM "$PID"
    wait "$PID" || true
    PID=
}

# queue_left: queued + running in the benchmark's queue
queue_left() {
    curl -s "$BASE/v1/queues/$Q" | jq '(.counts.queued // 0) + (.counts.running // 0)'
}

# One batch body: PER echo jobs in queue Q, each with ~130 bytes of args.
batch_body() { # first-n
    awk -v q="$Q" -v per="$PER" -v base="$1" 'BEGIN {
        pad = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore";
        printf "{\"jobs\":[";
        for (i = 0; i < per; i++) {
            printf "%s{\"handler\":\"echo\",\"queue\":\"%s\",\"priority\":%d,\"args\":{\"n\":%d,\"user\":\"u%06d\",\"text\":\"%s\"}}",
                   (i ? "," : ""), q, (base + i) % 4, base + i, (base + i) % 1000000, pad;
        }
        printf "]}";
    }'
}

submit_one() { # batch number
    local f=$WORK/batch.$1.json code
    batch_body $(($1 * PER)) >"$f"
    code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$BASE/v1/jobs/batch" \
        -H 'Content-Type: application/json' --data-binary "@$f")
    rm -f "$f"
    if [ "$code" != 201 ] && [ "$code" != 200 ]; then
        echo "bench-backlog: batch $1 answered $code" >&2
        return 1
    fi
}
export -f submit_one batch_body
export WORK BASE Q PER

# submit_all n: pause the queue and submit n jobs to it (n a multiple of PER).
submit_all() {
    curl -s -o /dev/null -X POST "$BASE/v1/queues/$Q/pause"
    export BASE
    seq 0 $(($1 / PER - 1)) | xargs -P 2 -I{} bash -c 'submit_one {}'
    local have
    have=$(queue_left)
    if [ "$have" != "$1" ]; then
        echo "bench-backlog: queue holds $have jobs, expected $1" >&2
        exit 1
    fi
}
cpu_ms() { awk '{print ($14 + $15) * 10}' "/proc/$PID/stat"; } # utime+stime, 100 Hz ticks
# drain_ms: resume the queue and time until it is empty: "wall_ms cpu_ms"
# (the server's CPU meanwhile).
drain_ms() {
    local t0 c0
    t0=$(now_ns)
    c0=$(cpu_ms)
    curl -s -o /dev/null -X POST "$BASE/v1/queues/$Q/resume"
    until [ "$(queue_left)" = 0 ]; do sleep 0.05; done
    echo $((($(now_ns) - t0) / 1000000)) $(($(cpu_ms) - c0))
}

N=$((N / PER * PER))
BASE_N=${BASE_N:-$((N < 50000 ? N : 50000))}
BASE_N=$((BASE_N / PER * PER))
start
sleep 0.5
IDLE=$(rss_kb)
T0=$(now_ns)
submit_all "$N"
SUBMIT_MS=$((($(now_ns) - T0) / 1000000))
sleep 0.5
QUEUED=$(rss_kb)

stop
start
RESTART_MS=$READY_MS
sleep 0.5
RESTARTED=$(rss_kb)
LEFT=$(queue_left)
[ "$LEFT" = "$N" ] || {
    echo "bench-backlog: after restart the queue holds $LEFT jobs, expected $N" >&2
    exit 1
}

read -r DRAIN_MS DRAIN_CPU <<<"$(drain_ms)"
sleep 1
DRAINED=$(rss_kb)
stop

# inversions db: jobs that started more than 50 ms before the last start of
# a higher priority (a drain in priority order has none; start times are
# stamped by whichever thread runs an admitted list, so a thread descheduled
# on a busy machine can stamp a little late: hence the slack).
inversions() {
    sqlite3 "$1" "CREATE TEMP TABLE m AS SELECT priority p, MAX(started_ms) last
        FROM jobs WHERE queue = '$Q' GROUP BY priority;
        CREATE TEMP TABLE t AS SELECT a.p, (SELECT MAX(b.last) FROM m b WHERE b.p > a.p) thr FROM m a;
        SELECT COUNT(*) FROM jobs j JOIN t ON t.p = j.priority
        WHERE j.queue = '$Q' AND j.started_ms + 50 < t.thr;"
}
INVERSIONS=$(inversions "$WORK/jd.db")

BASE_MS=0
BASE_CPU=0
BASEW_MS=0
BASEW_CPU=0
BASE_INV=-
if [ "$BASE_N" -gt 0 ]; then
    DBNAME=base start --queue-window 0
    submit_all "$BASE_N"
    read -r BASE_MS BASE_CPU <<<"$(drain_ms)"
    stop
    BASE_INV=$(inversions "$WORK/base.db")
    # The same BASE_N with the window, restarted as above: what N alone
    # costs (a larger database) beside what the window and the restart do.
    DBNAME=basew start
    submit_all "$BASE_N"
    stop
    DBNAME=basew start
    read -r BASEW_MS BASEW_CPU <<<"$(drain_ms)"
    stop
fi

echo "backlog: $N queued echo jobs (~130-byte args, priorities 0-3), --sync $SYNC," \
    "default --queue-window, $(date -u +%Y-%m-%d), $(nproc) CPUs"
printf '%-28s %14s %10s\n' "" "value" "vs idle"
printf '%-28s %14s %10s\n' "idle RSS (baseline)" "$(mib "$IDLE")" "1.00x"
printf '%-28s %14s %10s\n' "RSS with $N queued" "$(mib "$QUEUED")" "$(ratio "$QUEUED" "$IDLE")"
printf '%-28s %14s %10s\n' "  per queued job" "$(awk -v a="$QUEUED" -v b="$IDLE" -v n="$N" 'BEGIN {printf "%.2f KiB", (a - b) / n}')" ""
printf '%-28s %14s %10s\n' "RSS after restart" "$(mib "$RESTARTED")" "$(ratio "$RESTARTED" "$IDLE")"
printf '%-28s %14s %10s\n' "RSS after drain" "$(mib "$DRAINED")" "$(ratio "$DRAINED" "$IDLE")"
printf '%-28s %14s\n' "submit (batch route)" "$(awk -v n="$N" -v ms="$SUBMIT_MS" 'BEGIN {printf "%.0f jobs/s", n * 1000 / ms}')"
printf '%-28s %14s\n' "restart until ready" "$(awk -v ms="$RESTART_MS" 'BEGIN {printf "%.2f s", ms / 1000}')"
printf '%-28s %14s\n' "drain after resume" "$(awk -v n="$N" -v ms="$DRAIN_MS" 'BEGIN {printf "%.0f jobs/s", n * 1000 / ms}')"
printf '%-28s %14s\n' "  server CPU per job" "$(awk -v n="$N" -v c="$DRAIN_CPU" 'BEGIN {printf "%.1f us", c * 1000 / n}')"
if [ "$BASE_N" -gt 0 ]; then
    printf '%-28s %14s %10s\n' "baseline drain ($BASE_N, w 0)" \
        "$(awk -v n="$BASE_N" -v ms="$BASE_MS" 'BEGIN {printf "%.0f jobs/s", n * 1000 / ms}')" \
        "$(awk -v n="$N" -v ms="$DRAIN_MS" -v bn="$BASE_N" -v bms="$BASE_MS" 'BEGIN {printf "%.2fx", (n / ms) / (bn / bms)}')"
    printf '%-28s %14s %10s\n' "  server CPU per job" \
        "$(awk -v n="$BASE_N" -v c="$BASE_CPU" 'BEGIN {printf "%.1f us", c * 1000 / n}')" \
        "$(awk -v n="$N" -v c="$DRAIN_CPU" -v bn="$BASE_N" -v bc="$BASE_CPU" 'BEGIN {printf "%.2fx", (c / n) / (bc / bn)}')"
    printf '%-28s %14s %10s\n' "same, w default, restarted" \
        "$(awk -v n="$BASE_N" -v ms="$BASEW_MS" 'BEGIN {printf "%.0f jobs/s", n * 1000 / ms}')" \
        "$(awk -v n="$BASE_N" -v ms="$BASEW_MS" -v bn="$BASE_N" -v bms="$BASE_MS" 'BEGIN {printf "%.2fx", (n / ms) / (bn / bms)}')"
    printf '%-28s %14s %10s\n' "  server CPU per job" \
        "$(awk -v n="$BASE_N" -v c="$BASEW_CPU" 'BEGIN {printf "%.1f us", c * 1000 / n}')" \
        "$(awk -v n="$BASE_N" -v c="$BASEW_CPU" -v bn="$BASE_N" -v bc="$BASE_CPU" 'BEGIN {printf "%.2fx", (c / n) / (bc / bn)}')"
fi
printf '%-28s %14s %10s\n' "started out of priority" "$INVERSIONS jobs" "base $BASE_INV"
echo "RESULT backlog n=$N idle_kb=$IDLE queued_kb=$QUEUED restarted_kb=$RESTARTED drained_kb=$DRAINED" \
    "submit_ms=$SUBMIT_MS restart_ms=$RESTART_MS drain_ms=$DRAIN_MS drain_cpu_ms=$DRAIN_CPU" \
    "base_n=$BASE_N base_ms=$BASE_MS base_cpu_ms=$BASE_CPU basew_ms=$BASEW_MS basew_cpu_ms=$BASEW_CPU" \
    "inversions=$INVERSIONS base_inversions=$BASE_INV"
