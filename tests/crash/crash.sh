#!/usr/bin/env bash
# tests/crash/crash.sh ROUNDS CLIENTS: crash safety under load, the engine
# behind `make crash` (run.sh) and the short run in `make test`
# (test_crash_short.sh). Prints TAP lines.
#
# CLIENTS concurrent curl loops submit workflows to the real jackdawd; each
# workflow has three exec steps (with a sleep between) that append
# "<job id> <step> <wall ms>" to a side-effect file. The server is killed with
# SIGKILL at random moments ROUNDS times and restarted on the same database
# and port while the clients keep going. Then a clean start lets every job
# finish, and check.mjs compares the side-effect file with each job's
# history. What users rely on, and what is asserted:
#   - every job acknowledged with 201 is found after all the restarts;
#   - every one of them reaches a terminal state (and succeeds);
#   - a step whose completion was recorded never runs again (a second
#     dispatch after a recorded completion, or a side effect written after
#     it, counts as a re-run); steps that ran but whose completion was not yet
#     recorded may run again (at-least-once) and are reported, not failed.
#
# Environment: JD_BUILD (build dir, default build), CRASH_KEEP=1 keeps the
# work directory, CRASH_MIN_MS / CRASH_MAX_MS (time between kills, default
# 300..1500 ms), CRASH_PG=1: the node runs on a throwaway PostgreSQL
# (tests/pg/pg.sh, fsync on) instead of SQLite, with --lease 2s where the
# build has it (each restart is a new incarnation that takes the killed
# one's jobs over once its lease lapses), checked the same way.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROUNDS=${1:-3}
CLIENTS=${2:-4}
BUILD=${JD_BUILD:-build}
JACKDAWD=$BUILD/jackdawd
MIN_MS=${CRASH_MIN_MS:-300}
MAX_MS=${CRASH_MAX_MS:-1500}

if [ ! -x "$JACKDAWD" ] || [ ! -d "$BUILD/plugins" ]; then
    echo "not ok 1 - $JACKDAWD and $BUILD/plugins are built (run make first)"
    exit 1
fi
command -v node >/dev/null || tools/deps.sh nodejs >/dev/null 2>&1
command -v curl >/dev/null || tools/deps.sh curl >/dev/null 2>&1

WORK=$(mktemp -d "${TMPDIR:-/tmp}/jackdaw-crash.XXXXXX")
DB=$WORK/jackdaw.db
EFFECTS=$WORK/effects.log
ACKED=$WORK/acked
PORTFILE=$WORK/port
STOP=$WORK/stop
: >"$EFFECTS"
SERVER_PID=
CLIENT_PIDS=()

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    touch "$STOP"
    for p in "${CLIENT_PIDS[@]}"; do
        kill "$p" 2>/dev/null
    done
    if [ -n "$SERVER_PID" ]; then
        kill -KILL "$SERVER_PID" 2>/dev/null
    fi
    wait 2>/dev/null
    if [ "${CRASH_KEEP:-0}" = 1 ]; then
        echo "# work directory kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

LEASE_FLAGS=()
if [ "${CRASH_PG:-0}" = 1 ]; then
    # shellcheck source=tests/pg/pg.sh
    . tests/pg/pg.sh
    if ! pg_start; then
        echo "not ok 1 - a throwaway PostgreSQL starts (tests/pg/pg.sh)"
        exit 1
    fi
    DB=$PG_URL
    grep -q -- '--lease' <<<"$("$JACKDAWD" --help 2>&1)" && LEASE_FLAGS=(--lease 2s)
fi

# start_server PORT: start jackdawd on the database; sets SERVER_PID and
# writes the port it listens on to $PORTFILE. Port 0 picks a free one.
start_server() {
    local want=$1 log
    log=$WORK/server.$(date +%s%N).log
    # Random SIGKILLs are not a poison job, but on a loaded machine one job
    # can be caught running by several in a row: quarantine (tested by
    # tests/integration/test_quarantine.sh) is kept out of the way here,
    # while the crash counts are still written and reset on every start.
    "$JACKDAWD" --listen "127.0.0.1:$want" --db "$DB" --plugin-dir "$BUILD/plugins" \
        --exec-allow /bin/sh --sync full --workers 2 --grace 1s --max-replays 1000 \
        "${LEASE_FLAGS[@]}" 2>"$log" &
    SERVER_PID=$!
    local addr=
    # "ready" comes once plugins are loaded and jobs resumed; "listening" before.
    for _ in $(seq 1 200); do
        addr=$(sed -n 's/.*"msg":"ready".*"addr":"\([^"]*\)".*/\1/p' "$log" 2>/dev/null | head -n1)
        [ -n "$addr" ] && break
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.025
    done
    if [ -z "$addr" ]; then
        echo "# jackdawd did not start on port $want; its log:"
        sed 's/^/#   /' "$log" | tail -n 15
        return 1
    fi
    echo "${addr##*:}" >"$PORTFILE.tmp" && mv "$PORTFILE.tmp" "$PORTFILE"
}

# One client: submit workflows until told to stop; record each 201's id.
client() {
    local c=$1 i=0 port body out code id
    while [ ! -e "$STOP" ]; do
        i=$((i + 1))
        port=$(cat "$PORTFILE" 2>/dev/null) || { sleep 0.05; continue; }
        body=$(printf '{"steps":[%s,%s,%s,%s],"labels":{"client":"%s","n":"%s"}}' \
            "$(step a)" '{"id":"pause","sleep_ms":30}' "$(step b)" "$(step c)" "$c" "$i")
        out=$(curl -sS -m 5 -o - -w '\n%{http_code}' -XPOST "http://127.0.0.1:$port/v1/jobs" \
            -H 'content-type: application/json' --data-binary "$body" 2>/dev/null)
        code=${out##*$'\n'}
        if [ "$code" = 201 ]; then
            id=$(printf '%s' "${out%$'\n'*}" | sed -n 's/^{"id":"\([0-9]*\)".*/\1/p; t; s/.*"id" *: *"\([0-9]*\)".*/\1/p' | head -n1)
            [ -n "$id" ] && echo "$id" >>"$ACKED.$c"
        else
            sleep 0.02 # the server is down or restarting
        fi
    done
}
# The step's shell text is literal: $1 and $(date) expand when the step runs.
# shellcheck disable=SC2016
step() {
    printf '{"id":"%s","call":"exec","args":{"argv":["/bin/sh","-c","echo \\"$1 %s $(date +%%s%%3N)\\" >> %s","sh","${job.id}"]}}' \
        "$1" "$1" "$EFFECTS"
}

start_server 0 || {
    echo "not ok 1 - jackdawd starts"
    exit 1
}
PORT=$(cat "$PORTFILE")
echo "# jackdawd on 127.0.0.1:$PORT, db $DB, $CLIENTS clients, $ROUNDS kill -9 rounds"
for c in $(seq 1 "$CLIENTS"); do
    client "$c" &
    CLIENT_PIDS+=($!)
done

restart_failures=0
for r in $(seq 1 "$ROUNDS"); do
    ms=$((MIN_MS + RANDOM % (MAX_MS - MIN_MS + 1)))
    sleep "$(awk -v m="$ms" 'BEGIN{printf "%.3f", m/1000}')"
    kill -KILL "$SERVER_PID"
    wait "$SERVER_PID" 2>/dev/null
    n=$(cat "$ACKED".* 2>/dev/null | wc -l)
    echo "# round $r: SIGKILL after ${ms} ms ($n jobs acknowledged so far)"
    # Same port, so clients keep their address; a free one if it is taken.
    start_server "$PORT" || start_server 0 || {
        restart_failures=$((restart_failures + 1))
        break
    }
done
touch "$STOP"
for p in "${CLIENT_PIDS[@]}"; do
    wait "$p" 2>/dev/null
done
CLIENT_PIDS=()

# A last kill while the final submissions may still be in flight, then a
# clean start that runs everything to the end.
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null
start_server "$PORT" || start_server 0 || restart_failures=$((restart_failures + 1))
PORT=$(cat "$PORTFILE")
cat "$ACKED".* 2>/dev/null | sort -n | uniq >"$ACKED"
if [ "$restart_failures" -ne 0 ]; then
    echo "not ok 1 - jackdawd restarts after every SIGKILL"
    exit 1
fi
echo "ok 1 - jackdawd restarted after each of $((ROUNDS + 1)) SIGKILLs"

# Wait for every acknowledged job (long polls, 8 at a time), then fetch histories.
mkdir -p "$WORK/jobs"
export WORK PORT
# shellcheck disable=SC2016
xargs -P 8 -I{} sh -c 'curl -sS -m 40 "http://127.0.0.1:$PORT/v1/jobs/{}?wait=30s" >"$WORK/jobs/{}.json" 2>/dev/null;
    curl -sS -m 10 "http://127.0.0.1:$PORT/v1/jobs/{}/events?limit=1000" >"$WORK/jobs/{}.events.json" 2>/dev/null' <"$ACKED"

node tests/crash/check.mjs "$ACKED" "$WORK/jobs" "$EFFECTS" 2
rc=$?
n=9 # check.mjs printed 2..8
if [ "${CRASH_PG:-0}" = 1 ]; then
    # The database's own account: one completion per (job, tag, run).
    dup=$(pg_psql -At -c "SELECT count(*) FROM (SELECT job_id, tag, data::jsonb->'run' FROM events_all
        WHERE kind = 2 GROUP BY 1, 2, 3 HAVING count(*) > 1) d")
    if [ "$dup" = 0 ]; then
        echo "ok $n - no completion recorded twice for a (job, tag, run) (SQL on events)"
    else
        rc=1
        echo "not ok $n - no completion recorded twice for a (job, tag, run) (SQL on events: $dup)"
    fi
    n=$((n + 1))
fi

# A clean stop after all that: SIGTERM drains and exits 0 (under a sanitizer
# build this is also when leaks are reported).
kill -TERM "$SERVER_PID"
code=timeout
for _ in $(seq 1 300); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        wait "$SERVER_PID"
        code=$?
        break
    fi
    sleep 0.05
done
if [ "$code" = 0 ]; then
    SERVER_PID=
    echo "ok $n - jackdawd exits 0 on SIGTERM after the run"
else
    rc=1
    echo "not ok $n - jackdawd exits 0 on SIGTERM after the run (got $code)"
fi
n=$((n + 1))
if grep -l -E 'Sanitizer|runtime error:' "$WORK"/server.*.log >/dev/null 2>&1; then
    rc=1
    echo "not ok $n - no sanitizer reports in the server logs"
    grep -h -A 12 -E 'Sanitizer|runtime error:' "$WORK"/server.*.log | head -n 40 | sed 's/^/#   /'
else
    echo "ok $n - no sanitizer reports in the server logs"
fi
echo "1..$n"
exit "$rc"
