#!/usr/bin/env bash
# tests/crash/soak.sh: the soak run (not in `make test`; minutes). Pushes
# SOAK_JOBS (default 1,000,000) echo jobs through one jackdawd with
# retention on (SOAK_RETENTION, default 30s) using bench/loadgen, and prints
# the server's RSS and the database size (db + WAL) every SOAK_EVERY seconds.
# Passes when every job succeeded and both stay bounded: the largest value
# in the last third of the run is at most 1.5x (+16 MiB) the largest in the
# first third, i.e. nothing grows with the number of jobs done. Prints TAP.
#
# Environment: JD_BUILD (build dir), SOAK_JOBS, SOAK_CONNS (default 64),
# SOAK_RETENTION, SOAK_EVERY (default 5), SOAK_SYNC (full|normal, default full).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
BUILD=${JD_BUILD:-build}
JOBS=${SOAK_JOBS:-1000000}
CONNS=${SOAK_CONNS:-64}
RETENTION=${SOAK_RETENTION:-30s}
EVERY=${SOAK_EVERY:-5}
SYNC=${SOAK_SYNC:-full}
for f in "$BUILD/jackdawd" "$BUILD/bench/loadgen"; do
    if [ ! -x "$f" ]; then
        echo "not ok 1 - $f is built (make BUILD=$BUILD all $BUILD/bench/loadgen)"
        exit 1
    fi
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/jackdaw-soak.XXXXXX")
SERVER_PID=
LOADGEN_PID=
cleanup() {
    [ -n "$LOADGEN_PID" ] && kill "$LOADGEN_PID" 2>/dev/null
    [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
    wait 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

"$BUILD/jackdawd" --listen 127.0.0.1:0 --db "$WORK/jackdaw.db" --plugin-dir "$BUILD/plugins" \
    --sync "$SYNC" --retention "$RETENTION" --log-level warn 2>"$WORK/server.log" &
SERVER_PID=$!
# --log-level warn hides the "listening" line: find the port from the socket table.
PORT=
for _ in $(seq 1 200); do
    PORT=$(ss -ltnpH 2>/dev/null | awk -v p="pid=$SERVER_PID," '$0 ~ p {n=split($4,a,":"); print a[n]; exit}')
    [ -n "$PORT" ] && break
    sleep 0.05
done
if [ -z "$PORT" ]; then
    echo "not ok 1 - jackdawd starts"
    sed 's/^/# /' "$WORK/server.log"
    exit 1
fi
echo "# jackdawd on 127.0.0.1:$PORT, --sync $SYNC --retention $RETENTION; $JOBS jobs, $CONNS connections"

"$BUILD/bench/loadgen" --addr "127.0.0.1:$PORT" --jobs "$JOBS" --conns "$CONNS" \
    --timeout 3600 >"$WORK/loadgen.json" 2>"$WORK/loadgen.err" &
LOADGEN_PID=$!

start=$(date +%s)
: >"$WORK/samples"
printf '# %6s %10s %12s %12s\n' secs rss_mib db_mib jobs_done
while kill -0 "$LOADGEN_PID" 2>/dev/null; do
    sleep "$EVERY"
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$SERVER_PID/status" 2>/dev/null || echo 0)
    db=$(du -ck "$WORK"/jackdaw.db* 2>/dev/null | awk 'END {print $1}')
    done_jobs=$(curl -s "http://127.0.0.1:$PORT/metrics" |
        awk '/^jackdaw_jobs_finished_total/ {s += $2} END {printf "%d", s}')
    t=$(($(date +%s) - start))
    echo "$t $rss $db" >>"$WORK/samples"
    awk -v t="$t" -v r="$rss" -v d="$db" -v n="${done_jobs:-?}" \
        'BEGIN {printf "# %6d %10.1f %12.1f %12s\n", t, r / 1024, d / 1024, n}'
done
wait "$LOADGEN_PID"
lg_rc=$?
LOADGEN_PID=
sed 's/^/# /' "$WORK/loadgen.err"

n=1
if [ "$lg_rc" = 0 ]; then
    echo "ok $n - all $JOBS jobs succeeded ($(cat "$WORK/loadgen.json"))"
else
    echo "not ok $n - all $JOBS jobs succeeded ($(cat "$WORK/loadgen.json"))"
fi
# Bounded: compare the first and the last third of the samples.
verdict() { # column
    awk -v col="$1" '
        { v[NR] = $col }
        END {
            third = int(NR / 3); if (third < 1) { print "skip"; exit }
            for (i = 1; i <= third; i++) if (v[i] > a) a = v[i]
            for (i = NR - third + 1; i <= NR; i++) if (v[i] > b) b = v[i]
            printf "%s %.1f %.1f\n", (b <= 1.5 * a + 16384) ? "ok" : "not ok", a / 1024, b / 1024
        }' "$WORK/samples"
}
for spec in "2:RSS" "3:database size"; do
    col=${spec%%:*}
    what=${spec#*:}
    read -r res a b <<<"$(verdict "$col")"
    n=$((n + 1))
    if [ "$res" = skip ]; then
        echo "not ok $n - $what bounded: too few samples (run longer or lower SOAK_EVERY)"
    elif [ "$res" = ok ]; then
        echo "ok $n - $what bounded (max $a MiB in the first third, $b MiB in the last)"
    else
        echo "not ok $n - $what bounded (max $a MiB in the first third, $b MiB in the last)"
    fi
done
echo "1..$n"
