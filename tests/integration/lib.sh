# shellcheck shell=bash disable=SC2034
# Shared helpers for the integration scripts (sourced, not run): start the
# real jackdawd on an ephemeral loopback port with a temporary database,
# make requests with curl, print TAP lines, and always stop the server and
# remove the temporary directory on exit, whatever happened.
#
#   start_server [flags...]   sets BASE (http://127.0.0.1:PORT), SERVER_PID, LOG
#   stop_server [SIG|wait]    SIGTERM by default; sets SERVER_RC
#   req METHOD PATH [curl args...]   sets STATUS, BODY, HDRS (header text)
#   check "name" command...   one TAP line from the command's exit status
#   finish                    exits non-zero when any check failed
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
BUILD=${JD_BUILD:-build}
JACKDAWD=$BUILD/jackdawd
WORK=$(mktemp -d "${TMPDIR:-/tmp}/jackdaw-it.XXXXXX")
DB=${JD_TEST_DB:-$WORK/jackdaw.db} # JD_TEST_DB: another database (a postgres:// URL)
TAPN=0
FAILED=0
SERVER_PID=
SERVER_RC=
STARTS=0
LOG=
BASE=
STATUS=
BODY=
HDRS=

cleanup() {
    if [ -n "$SERVER_PID" ]; then
        kill -KILL "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
    fi
    if [ "${JD_KEEP:-0}" = 1 ]; then
        echo "# kept $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ok() {
    TAPN=$((TAPN + 1))
    echo "ok $TAPN - $1"
}

notok() {
    TAPN=$((TAPN + 1))
    FAILED=$((FAILED + 1))
    echo "not ok $TAPN - $1"
    shift
    for line in "$@"; do
        echo "# $line" | head -c 2000
        echo
    done
}

# check "name" cmd args...: ok when the command succeeds; on failure the last
# response is shown.
check() {
    local name=$1
    shift
    if "$@"; then
        ok "$name"
    else
        notok "$name" "status $STATUS" "body ${BODY:0:600}"
    fi
}

# True when jackdawd is built with AddressSanitizer (its memory and speed
# are then not the server's).
# (no pipe into grep -q: with pipefail, ldd's SIGPIPE would fail it at random)
asan_build() { [[ "$(ldd "$JACKDAWD" 2>/dev/null)" == *libasan* ]]; }

# check_perf "name" cmd args...: like check for a memory or latency bound;
# said as a SKIP under AddressSanitizer, whose quarantine and shadow memory
# and slowdown make such numbers meaningless (the figure is still printed).
check_perf() {
    if asan_build; then
        ok "$1 # SKIP AddressSanitizer build"
    else
        check "$@"
    fi
}

finish() {
    echo "# $TAPN checks, $FAILED failed"
    [ "$FAILED" -eq 0 ]
}

if [ ! -x "$JACKDAWD" ] || [ ! -d "$BUILD/plugins" ]; then
    echo "not ok 1 - $JACKDAWD and $BUILD/plugins are built (run make first)"
    exit 1
fi

start_server() {
    STARTS=$((STARTS + 1))
    LOG=$WORK/server.$STARTS.log
    : >"$LOG"
    "$JACKDAWD" --listen 127.0.0.1:0 --db "$DB" --plugin-dir "$BUILD/plugins" "$@" 2>"$LOG" &
    SERVER_PID=$!
    local addr=
    for _ in $(seq 1 200); do
        addr=$(grep -o '"msg":"listening","addr":"[^"]*"' "$LOG" | head -n 1 | cut -d'"' -f8)
        [ -n "$addr" ] && break
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.05
    done
    if [ -z "$addr" ]; then
        notok "server starts" "$(tail -n 5 "$LOG")"
        SERVER_PID=
        return 1
    fi
    BASE=http://$addr
    for _ in $(seq 1 200); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/readyz")" = 200 ] && return 0
        sleep 0.05
    done
    notok "server becomes ready" "$(tail -n 5 "$LOG")"
    return 1
}

stop_server() {
    local sig=${1:-TERM}
    [ -n "$SERVER_PID" ] || return 0
    # "wait": the signal was already sent (a second one would exit at once)
    [ "$sig" = wait ] || kill -"$sig" "$SERVER_PID" 2>/dev/null
    wait "$SERVER_PID"
    SERVER_RC=$?
    SERVER_PID=
}

req() {
    local method=$1 path=$2
    shift 2
    local out
    rm -f "$WORK/body" "$WORK/hdrs"
    out=$(curl -s -S -X "$method" -o "$WORK/body" -D "$WORK/hdrs" -w '%{http_code}' \
        --max-time "${REQ_TIMEOUT:-20}" "$@" "$BASE$path" 2>"$WORK/curlerr")
    STATUS=${out:-000}
    BODY=$(cat "$WORK/body" 2>/dev/null)
    HDRS=$(tr -d '\r' <"$WORK/hdrs" 2>/dev/null)
}

# Helpers for conditions.
body_ends_with_newline() { [ "$(tail -c 1 "$WORK/body" | od -An -tx1 | tr -d ' ')" = 0a ]; }
status_is() { [ "$STATUS" = "$1" ]; }
# (here-strings, not pipes: with pipefail, grep -q exiting early would
# fail the pipeline with SIGPIPE on a large body)
body_has() { grep -qF -- "$1" <<<"$BODY"; }
header_has() { grep -qiF -- "$1" <<<"$HDRS"; }
is_problem() {
    status_is "$1" && header_has "Content-Type: application/problem+json" &&
        body_has "\"status\":$1" && body_has '"title":'
}
# The job id of the last 201 (from Location).
location_id() { printf '%s\n' "$HDRS" | sed -n 's|^[Ll]ocation: /v1/jobs/||p'; }
json_post() { req POST "$1" -H 'Content-Type: application/json' --data-binary "$2" "${@:3}"; }
# Wait (long-poll) until job $1 is terminal; BODY is the job.
wait_job() { req GET "/v1/jobs/$1?wait=${2:-20s}"; }

# Cluster nodes on one PostgreSQL (PG_URL: tests/pg/pg.sh's pg_start):
#   start_node NAME [PORT]   a node on 127.0.0.1:PORT (default 0: any) with
#                            the caller's NODE_FLAGS; sets BASE_NAME and
#                            PID_NAME, adds its pid to NODES, its log is
#                            $WORK/node.NAME.log
#   on NAME cmd...           run cmd (req, json_post, ...) against node NAME
NODES=()
NODE_FLAGS=()
start_node() { # the node itself: pg_node (tests/pg/pg.sh)
    pg_node "$1" --listen "127.0.0.1:${2:-0}" "${NODE_FLAGS[@]}"
}
on() {
    local v="BASE_$1"
    BASE=${!v}
    shift
    "$@"
}
