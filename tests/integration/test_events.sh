#!/usr/bin/env bash
# GET /v1/events against the real server (issue 19): every job's
# transitions in commit order as JSON pages (?after=, next_after) and as a
# live SSE stream, filtered by queue, state and label; resume with
# Last-Event-ID (also across a restart); bad filters; the parked-slot cap
# shared with the job streams. Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

py() { python3 -c "import json,sys; d=json.load(sys.stdin); $1" <<<"$BODY"; }
# "job:state" for each event of the JSON page
pairs() { py 'print(" ".join(e["job_id"]+":"+e["state"] for e in d["events"]))'; }
ids_ascending() { py 'ids=[int(e["id"]) for e in d["events"]]; sys.exit(0 if ids == sorted(ids) and len(set(ids)) == len(ids) else 1)'; }

# Open an SSE stream on $1 (path) for $2 seconds in the background, into $3;
# extra curl args after. Sets SSE_PID.
sse_open() {
    local path=$1 secs=$2 out=$3
    shift 3
    curl -s -N --max-time "$secs" -H 'Accept: text/event-stream' "$@" "$BASE$path" >"$out" &
    SSE_PID=$!
}
# "job:state" of each data line of an SSE capture
sse_pairs() {
    grep '^data: ' "$1" | sed 's/^data: //' |
        python3 -c 'import json,sys; print(" ".join(json.loads(l)["job_id"]+":"+json.loads(l)["state"] for l in sys.stdin))'
}

start_server || exit 1

json_post /v1/jobs '{"handler":"echo","args":{},"queue":"evq","labels":{"team":"billing"}}'
A=$(location_id)
wait_job "$A"
json_post /v1/jobs '{"handler":"fail","args":{},"queue":"other"}'
B=$(location_id)
wait_job "$B"

# ---- JSON ----
req GET '/v1/events?after=0'
check "every transition, in commit order" \
    eval '[ "$(pairs)" = "$A:queued $A:running $A:succeeded $B:queued $B:running $B:failed" ] && ids_ascending'
check "an event has its id, job, seq, time, queue and data" \
    eval 'body_has "\"job_id\":\"$A\",\"seq\":1,\"time\":\"20" && body_has "\"queue\":\"evq\",\"state\":\"queued\",\"data\":{\"state\":\"queued\"}"'
LAST=$(py 'print(d["next_after"])')
req GET '/v1/events?after=0&limit=2'
N2=$(py 'print(d["next_after"])')
check "limit pages: two events and where to go on" eval '[ "$(pairs)" = "$A:queued $A:running" ]'
req GET "/v1/events?after=$N2&limit=2"
check "the next page goes on from next_after" eval '[ "$(pairs)" = "$A:succeeded $B:queued" ]'
req GET "/v1/events?after=$LAST"
check "nothing newer: empty, next_after unchanged" \
    eval 'body_has "{\"events\":[],\"next_after\":\"$LAST\"}"'
req GET '/v1/events?after=0&queue=evq'
check "queue filter" eval '[ "$(pairs)" = "$A:queued $A:running $A:succeeded" ]'
req GET '/v1/events?after=0&state=succeeded,failed'
check "state filter (a list)" eval '[ "$(pairs)" = "$A:succeeded $B:failed" ]'
req GET '/v1/events?after=0&label=team:billing&state=running'
check "label and state" eval '[ "$(pairs)" = "$A:running" ]'
req GET '/v1/events?state=bogus'
check "unknown state: 400" eval 'is_problem 400 && body_has "comma-separated"'
req GET '/v1/events?state=queued,'
check "a trailing comma is fine" status_is 200
req GET '/v1/events?label=a:1&label=b:1&label=c:1&label=d:1&label=e:1&label=f:1&label=g:1&label=h:1&label=i:1'
check "nine labels: 400" is_problem 400
req GET '/v1/events?after=-1'
check "negative after: 400" is_problem 400
req GET '/v1/events?limit=5000'
check "limit over 1000: 400" is_problem 400

# the README's two examples, run as they are (the stream until a timeout)
sed -n '/^## Events for every job/,/^## /p' README.md | sed -n '/^```sh$/,/^```$/p' | sed '1d;$d' \
    >"$WORK/readme.sh"
JD=$BASE timeout 2 sh "$WORK/readme.sh" >"$WORK/readme.out" 2>&1
check "the README's examples run: a page of succeeded and failed transitions" \
    eval 'grep -q "{\"events\":\[{\"id\":\"[0-9]*\",\"job_id\":\"$A\",.*\"state\":\"succeeded\"" "$WORK/readme.out" && [ "$(wc -l <"$WORK/readme.sh")" = 2 ]'

# ---- SSE ----
sse_open '/v1/events?queue=evq' 3 "$WORK/live.txt"
sleep 0.5
json_post /v1/jobs '{"handler":"echo","args":{},"queue":"evq"}'
C=$(location_id)
json_post /v1/jobs '{"handler":"echo","args":{},"queue":"other"}'
O=$(location_id)
json_post /v1/jobs '{"handler":"echo","args":{},"queue":"evq"}'
D=$(location_id)
wait "$SSE_PID"
check "a live stream starts at now and sends the queue's transitions as they commit" \
    eval '[ "$(sse_pairs "$WORK/live.txt")" = "$C:queued $C:running $C:succeeded $D:queued $D:running $D:succeeded" ]'
check "SSE ids are event ids, event name state" \
    eval 'grep -q "^id: [0-9][0-9]*$" "$WORK/live.txt" && grep -q "^event: state$" "$WORK/live.txt"'

sse_open '/v1/events?state=succeeded' 1 "$WORK/resume.txt" -H "Last-Event-ID: $LAST"
wait "$SSE_PID"
check "Last-Event-ID resumes after that event" \
    eval '[ "$(sse_pairs "$WORK/resume.txt")" = "$C:succeeded $O:succeeded $D:succeeded" ]'
req GET '/v1/events' -H 'Accept: text/event-stream' -H 'Last-Event-ID: nope'
check "a bad Last-Event-ID: 400" is_problem 400

# ---- restart: ids keep their order, resume works across it ----
stop_server
start_server --max-parked 1 --heartbeat 1s || exit 1
json_post /v1/jobs '{"handler":"echo","args":{},"queue":"evq"}'
E=$(location_id)
wait_job "$E"
sse_open '/v1/events?queue=evq&state=succeeded' 1 "$WORK/after.txt" -H "Last-Event-ID: $LAST"
sleep 0.3
req GET '/v1/events' -H 'Accept: text/event-stream'
check "streams share the parked-slot cap (--max-parked 1): 429" is_problem 429
wait "$SSE_PID"
check "resume across a restart" \
    eval '[ "$(sse_pairs "$WORK/after.txt")" = "$C:succeeded $D:succeeded $E:succeeded" ]'
# a client gone while its stream is parked is noticed at the next heartbeat
sleep 1.5
req GET '/v1/events' -H 'Accept: text/event-stream' --max-time 1
check "the slot is given back when a stream ends: a new one is admitted" status_is 200
stop_server
finish
