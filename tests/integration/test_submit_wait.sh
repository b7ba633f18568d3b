#!/usr/bin/env bash
# POST /v1/jobs?wait=DURATION: submit a job and get it back, in the same
# request, once it has ended (or the wait has). What a client relies on:
# 201 with Location and ETag and the job as a read gives it; a wait that
# ends first still answers 201 with the job as it is; idempotent replays
# and a unique key's holder wait too; a bad wait is a 400 that creates
# nothing; a client that hangs up loses no job; with no parked slot free
# the job is answered as submitted, never a 429 (which would invite a
# second submit); a server that drains answers the waiters. Prints TAP.
# shellcheck disable=SC2016,SC2034
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

count_jobs() {
    req GET "/v1/jobs?limit=500"
    python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])["jobs"]))' "$BODY"
}
etag() { printf '%s\n' "$HDRS" | sed -n 's/^[Ee][Tt]ag: //p'; }
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }

start_server --max-wait 5s || exit 1

# ---- the job's end, in the submit's answer ----
json_post '/v1/jobs?wait=10s' '{"handler":"echo","args":{"v":7}}'
ID=$(location_id)
check "an echo job: 201 with Location, succeeded with its output" eval \
    'status_is 201 && [ -n "$ID" ] && body_has "\"state\":\"succeeded\"" && body_has "\"output\":{\"v\":7}"'
BODY1=$BODY
TAG1=$(etag)
req GET "/v1/jobs/$ID"
check "the answer is byte for byte a read of the job, ETag included" eval \
    '[ "$BODY1" = "$BODY" ] && [ -n "$TAG1" ] && [ "$TAG1" = "$(etag)" ]'

t0=$(date +%s%N)
json_post '/v1/jobs?wait=10s' '{"handler":"sleep","args":{"ms":600}}'
ms=$(ms_since "$t0")
check "a 600 ms job: answered when it ends (${ms} ms)" eval \
    'status_is 201 && body_has "\"state\":\"succeeded\"" && [ "$ms" -ge 500 ] && [ "$ms" -lt 5000 ]'

json_post '/v1/jobs?wait=10s' '{"handler":"fail","args":{}}'
check "a failing job: 201 with its failure" eval 'status_is 201 && body_has "\"state\":\"failed\"" && body_has "\"error\":{"'

json_post '/v1/jobs?wait=10s' '{"steps":[{"id":"a","call":"echo","args":{"v":1}},{"id":"p","sleep_ms":100},{"id":"b","call":"echo","args":{"x":"${steps.a.output.v}"}}]}'
check "a workflow: 201 with its steps' outputs" eval 'status_is 201 && body_has "\"state\":\"succeeded\"" && body_has "\"b\":{\"x\":1}"'

# ---- a wait that ends first ----
t0=$(date +%s%N)
json_post '/v1/jobs?wait=300ms' '{"handler":"sleep","args":{"ms":3000}}'
ms=$(ms_since "$t0")
SLOW=$(location_id)
check "wait=300ms on a 3 s job: 201 with the job not yet ended (${ms} ms)" eval \
    'status_is 201 && [ -n "$SLOW" ] && ! body_has "\"state\":\"succeeded\"" && [ "$ms" -ge 250 ] && [ "$ms" -lt 2500 ]'
t0=$(date +%s%N)
json_post '/v1/jobs?wait=1h' '{"handler":"sleep","args":{"ms":8000}}'
ms=$(ms_since "$t0")
check "wait=1h is capped at --max-wait 5s (${ms} ms)" eval \
    'status_is 201 && ! body_has "\"state\":\"succeeded\"" && [ "$ms" -ge 4500 ] && [ "$ms" -lt 7500 ]'
json_post '/v1/jobs?wait=0s' '{"handler":"sleep","args":{"ms":2000}}'
check "wait=0s answers at once, as a plain submit" eval 'status_is 201 && body_has "\"state\":\"queued\""'
wait_job "$SLOW"
check "the job whose wait ended went on to succeed" body_has '"state":"succeeded"'

# ---- bad waits create nothing ----
before=$(count_jobs)
for w in forever -1s 10parsecs '' 99999999999999999999h; do
    json_post "/v1/jobs?wait=$w" '{"handler":"echo"}'
    check "wait=$w: 400 problem" is_problem 400
done
json_post "/v1/jobs?wait=$(head -c 10000 /dev/zero | tr '\0' 9)ms" '{"handler":"echo"}'
check "a 10,000-digit wait: 400 problem" is_problem 400
json_post '/v1/jobs?wait=forever' '{"handler":"nope"}'
check "a bad wait is refused before the body is looked at" is_problem 400
check "and none of them created a job" eval '[ "$(count_jobs)" = "$before" ]'
json_post '/v1/jobs?wait=5s' '{"handler":"nope"}'
check "a bad definition with a wait: 422 as without" is_problem 422

json_post '/v1/jobs?wait=10s&wait=forever' '{"handler":"echo","args":{"twice":1}}'
check "wait given twice: the first counts (201, the job ended)" eval \
    'status_is 201 && body_has "\"state\":\"succeeded\""'

# ---- idempotent replays and unique keys wait too ----
json_post '/v1/jobs?wait=10s' '{"handler":"sleep","args":{"ms":300}}' -H 'Idempotency-Key: sw-1'
FIRST=$(location_id)
check "with an Idempotency-Key: 201, succeeded" eval 'status_is 201 && body_has "\"state\":\"succeeded\""'
json_post '/v1/jobs?wait=10s' '{"handler":"sleep","args":{"ms":300}}' -H 'Idempotency-Key: sw-1'
check "its replay: 201, Idempotent-Replayed, the same job, ended" eval \
    'status_is 201 && header_has "Idempotent-Replayed: true" && [ "$(location_id)" = "$FIRST" ] && body_has "\"state\":\"succeeded\""'

json_post /v1/jobs '{"handler":"sleep","args":{"ms":800},"unique":{"key":"sw-u","on_conflict":"return_existing"}}'
HOLDER=$(location_id)
t0=$(date +%s%N)
json_post '/v1/jobs?wait=10s' '{"handler":"sleep","args":{"ms":800},"unique":{"key":"sw-u","on_conflict":"return_existing"}}'
ms=$(ms_since "$t0")
check "return_existing: 200 with the holder, answered when it ends (${ms} ms)" eval \
    'status_is 200 && [ "$(location_id)" = "$HOLDER" ] && body_has "\"state\":\"succeeded\"" && [ "$ms" -ge 300 ]'
json_post /v1/jobs '{"handler":"sleep","args":{"ms":1500},"unique":{"key":"sw-r","on_conflict":"reject"}}'
t0=$(date +%s%N)
json_post '/v1/jobs?wait=10s' '{"handler":"sleep","args":{"ms":10},"unique":{"key":"sw-r","on_conflict":"reject"}}'
ms=$(ms_since "$t0")
check "reject: 409 at once, no wait (${ms} ms)" eval \
    'is_problem 409 && body_has "existing_job_id" && [ "$ms" -lt 1000 ]'

# ---- a client that hangs up loses no job ----
curl -s -o /dev/null --max-time 0.3 -H 'Content-Type: application/json' \
    --data-binary '{"handler":"sleep","args":{"ms":700},"labels":{"who":"gone"}}' "$BASE/v1/jobs?wait=10s"
sleep 1.2
req GET '/v1/jobs?limit=500'
check "the job of a client that hung up mid-wait ran to its end" eval \
    'python3 -c "import json,sys; j=[x for x in json.loads(sys.argv[1])[\"jobs\"] if x.get(\"labels\",{}).get(\"who\")==\"gone\"]; sys.exit(0 if len(j)==1 and j[0][\"state\"]==\"succeeded\" else 1)" "$BODY"'
req GET /livez
check "and the server answers" status_is 200
stop_server
check "a clean stop after the hang-up" eval '[ "$SERVER_RC" = 0 ]'

# ---- no parked slot free: answered as submitted, never 429 ----
start_server --max-parked 1 || exit 1
json_post /v1/jobs '{"handler":"sleep","args":{"ms":3000}}'
curl -s -o /dev/null --max-time 10 "$BASE/v1/jobs/$(location_id)?wait=5s" &
HOLD=$!
sleep 0.3
t0=$(date +%s%N)
json_post '/v1/jobs?wait=10s' '{"handler":"sleep","args":{"ms":1000}}'
ms=$(ms_since "$t0")
check "every parked slot taken: 201 at once with the job as submitted (${ms} ms)" eval \
    'status_is 201 && [ -n "$(location_id)" ] && body_has "\"state\":\"queued\"" && [ "$ms" -lt 800 ]'
wait "$HOLD"

# ---- a draining server answers its waiters ----
json_post /v1/jobs '{"steps":[{"id":"w","wait":"never","timeout_ms":60000}]}'
curl -s -o "$WORK/drain.body" -w '%{http_code}' --max-time 20 -H 'Content-Type: application/json' \
    --data-binary '{"handler":"sleep","args":{"ms":30000}}' "$BASE/v1/jobs?wait=5s" >"$WORK/drain.status" &
CURL=$!
sleep 0.5
t0=$(date +%s%N)
kill -TERM "$SERVER_PID"
wait "$CURL"
ms=$(ms_since "$t0")
check "SIGTERM answers a waiting submit at once with its unfinished job, 201 (${ms} ms)" eval \
    '[ "$(cat "$WORK/drain.status")" = 201 ] && grep -q "\"state\":\"running\"" "$WORK/drain.body" && [ "$ms" -lt 2000 ]'
stop_server wait
check "and it stops cleanly" eval '[ "$SERVER_RC" = 0 ]'
finish
