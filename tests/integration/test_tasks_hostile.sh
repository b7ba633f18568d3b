#!/usr/bin/env bash
# Hostile input to the remote-command and task routes: bad bodies, wrong
# types, huge max / wait_ms / lease_ms, unknown and malformed task ids and
# command names, a non-object error, oversized fields, and more parked
# claims than --max-parked. Each gets its 4xx problem with a pointer where
# one helps; afterwards the server still hands out and completes tasks.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

start_server --max-parked 2 || exit 1

J='Content-Type: application/json'
py() { python3 -c "import json,sys; j=json.loads(sys.stdin.read()); $1" <<<"$BODY"; }
claim() { req POST /v1/tasks/claim -H "$J" --data-binary "$1"; }
pointer_is() { is_problem "$1" && body_has "\"pointer\":\"$2\""; }

req PUT /v1/commands/work -H "$J" --data-binary '{}'
check "setup: a remote command" status_is 201

# ---- command names and bodies ----
req PUT '/v1/commands/Bad%20Name' -H "$J" --data-binary '{}'
check "PUT a name that cannot be a command: 404" is_problem 404
req PUT "/v1/commands/$(printf 'a%.0s' {1..65})" -H "$J" --data-binary '{}'
check "PUT a 65-character name: 404" is_problem 404
req PUT /v1/commands/x1 -H "$J" --data-binary '{"timeout_ms":-5}'
check "negative timeout_ms: 422 /timeout_ms" pointer_is 422 /timeout_ms
req PUT /v1/commands/x1 -H "$J" --data-binary '{"timeout_ms":1e300}'
check "absurd timeout_ms: 422 /timeout_ms" pointer_is 422 /timeout_ms
req PUT /v1/commands/x1 -H "$J" --data-binary '{"timeout_ms":"10s"}'
check "string timeout_ms: 422 /timeout_ms" pointer_is 422 /timeout_ms
req PUT /v1/commands/x1 -H "$J" --data-binary "{\"description\":\"$(head -c 2000 /dev/zero | tr '\0' d)\"}"
check "a 2000-byte description: 422 /description" pointer_is 422 /description
req PUT /v1/commands/x1 -H "$J" --data-binary '[1]'
check "an array body: 422" is_problem 422
req PUT /v1/commands/x1 -H "$J" --data-binary '{"a":'
check "truncated JSON: 400" is_problem 400
req GET /v1/commands/x1
check "nothing of it was registered" is_problem 404
req DELETE /v1/commands/never
check "DELETE an unknown command: 404" is_problem 404

# ---- claim bodies ----
claim '{}'
check "claim without commands: 422 /commands" pointer_is 422 /commands
claim '{"commands":[]}'
check "claim with no commands: 422 /commands" pointer_is 422 /commands
claim '{"commands":"work"}'
check "commands as a string: 422 /commands" pointer_is 422 /commands
claim '{"commands":["work",7]}'
check "a non-string command: 422 /commands/1" pointer_is 422 /commands/1
claim '{"commands":["work","nope"]}'
check "an unregistered command: 422 /commands/1" pointer_is 422 /commands/1
many=$(python3 -c 'import json; print(json.dumps({"commands": ["work"] * 40}))')
claim "$many"
check "40 commands in one claim: 422 /commands" pointer_is 422 /commands
claim '{"commands":["work"],"max":0}'
check "max 0: 422 /max" pointer_is 422 /max
claim '{"commands":["work"],"max":1000000}'
check "a huge max: 422 /max" pointer_is 422 /max
claim '{"commands":["work"],"max":1.5}'
check "a fractional max: 422 /max" pointer_is 422 /max
claim '{"commands":["work"],"wait_ms":86400000}'
check "a day-long wait: 422 /wait_ms" pointer_is 422 /wait_ms
claim '{"commands":["work"],"wait_ms":-1}'
check "a negative wait: 422 /wait_ms" pointer_is 422 /wait_ms
claim '{"commands":["work"],"lease_ms":10}'
check "a 10 ms lease: 422 /lease_ms" pointer_is 422 /lease_ms
claim '{"commands":["work"],"lease_ms":1e12}'
check "a lease of decades: 422 /lease_ms" pointer_is 422 /lease_ms
claim '{"commands":["work"],"worker":{"x":1}}'
check "a non-string worker: 422 /worker" pointer_is 422 /worker
claim "{\"commands\":[\"work\"],\"worker\":\"$(head -c 500 /dev/zero | tr '\0' w)\"}"
check "a 500-byte worker name: 422 /worker" pointer_is 422 /worker
claim '"work"'
check "a bare string body: 422" is_problem 422
claim '{"commands":["work"]'
check "truncated claim: 400" is_problem 400
req POST /v1/tasks/claim -H 'Content-Type: text/plain' --data-binary '{"commands":["work"]}'
check "claim as text/plain: 415" is_problem 415

# ---- parked claims are bounded by --max-parked ----
PIDS=()
for i in 1 2; do
    curl -s -o "$WORK/park.$i" -H "$J" --data-binary '{"commands":["work"],"wait_ms":3000}' \
        "$BASE/v1/tasks/claim" &
    PIDS+=($!)
done
sleep 0.5
claim '{"commands":["work"],"wait_ms":3000}'
check "a third parked claim over --max-parked 2: 429 + Retry-After" eval 'is_problem 429 && header_has "Retry-After:"'
wait "${PIDS[@]}"
check "the parked claims ended empty" eval 'grep -q "\"tasks\":\[\]" "$WORK/park.1" && grep -q "\"tasks\":\[\]" "$WORK/park.2"'

# ---- task ids and end bodies ----
req POST /v1/jobs -H "$J" --data-binary '{"handler":"work","args":{"a":1}}'
JOB=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])' <<<"$BODY")
claim '{"commands":["work"],"lease_ms":30000}'
TID=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["tasks"][0]["id"])' <<<"$BODY")
for bad in nope "../../etc" "$(printf 'f%.0s' {1..32})" "$(printf 'f%.0s' {1..300})" "${TID^^}"; do
    req POST "/v1/tasks/$bad/complete" -H "$J" --data-binary '{"result":1}'
    check "complete an unknown id (${bad:0:12}...): 404" is_problem 404
done
req POST "/v1/tasks/$TID/fail" -H "$J" --data-binary '{"error":"it broke"}'
check "a non-object error: 422 /error" pointer_is 422 /error
req POST "/v1/tasks/$TID/fail" -H "$J" --data-binary '{"error":null}'
check "a null error: 422 /error" pointer_is 422 /error
req POST "/v1/tasks/$TID/fail" -H "$J" --data-binary '{}'
check "no error at all: 422 /error" pointer_is 422 /error
req POST "/v1/tasks/$TID/fail" -H "$J" --data-binary '{"error":{"message":5}}'
check "a numeric message: 422 /error/message" pointer_is 422 /error/message
req POST "/v1/tasks/$TID/fail" -H "$J" --data-binary '{"error":{"kind":"Has Spaces"}}'
check "a kind that is not a word: 422 /error/kind" pointer_is 422 /error/kind
req POST "/v1/tasks/$TID/fail" -H "$J" --data-binary '{"error":{"retryable":"yes"}}'
check "a string retryable: 422 /error/retryable" pointer_is 422 /error/retryable
req POST "/v1/tasks/$TID/complete" -H "$J" --data-binary '[]'
check "an array complete body: 422" is_problem 422
req POST "/v1/tasks/$TID/complete" -H "$J" --data-binary 'nul'
check "malformed complete body: 400" is_problem 400
req POST "/v1/tasks/$TID/complete" -H "$J"
check "an empty complete body: 400" is_problem 400
python3 -c 'import json; print(json.dumps({"result": "x" * 1100000}))' >"$WORK/big"
req POST "/v1/tasks/$TID/complete" -H "$J" --data-binary @"$WORK/big"
check "a result over the 1 MiB limit: 413 /result" pointer_is 413 /result
req POST "/v1/tasks/$TID/heartbeat" -H "$J" --data-binary '{"lease_ms":"1m"}'
check "a string lease_ms in a heartbeat: 422 /lease_ms" pointer_is 422 /lease_ms
req POST "/v1/tasks/$TID/heartbeat" -H "$J" --data-binary '{"lease_ms":99999999999}'
check "a huge heartbeat lease: 422 /lease_ms" pointer_is 422 /lease_ms
python3 -c 'import json; print(json.dumps({"progress": "p" * 20000}))' >"$WORK/bigp"
req POST "/v1/tasks/$TID/heartbeat" -H "$J" --data-binary @"$WORK/bigp"
check "progress over 16 KiB: 413 /progress" pointer_is 413 /progress
req POST "/v1/tasks/$TID/heartbeat" -H "$J" --data-binary '[]'
check "an array heartbeat body: 422" is_problem 422
req POST "/v1/tasks/ffffffffffffffffffffffffffffffff/heartbeat" -H "$J" --data-binary '{}'
check "heartbeat an unknown id: 404" is_problem 404
req GET "/v1/workers?within=forever"
check "workers?within=forever: 400" is_problem 400
req GET "/v1/workers?within=400d"
check "workers?within=400d: 400" is_problem 400
big=$(python3 -c 'import json; print(json.dumps({"tasks": [{"id": "x", "result": 1}] * 1001}))')
req POST /v1/tasks/complete -H "$J" --data-binary "$big"
check "a batch of 1001: 422 /tasks" pointer_is 422 /tasks
req POST /v1/tasks/complete -H "$J" --data-binary '{"tasks":[]}'
check "an empty batch: 422 /tasks" pointer_is 422 /tasks
req POST /v1/tasks/complete -H "$J" --data-binary '{"tasks":[7]}'
check "a batch item that is not an object: 422 /tasks/0" pointer_is 422 /tasks/0
req POST /v1/tasks/complete -H "$J" --data-binary '{"tasks":[{"result":1}]}'
check "a batch item without an id: 422 /tasks/0/id" pointer_is 422 /tasks/0/id
req POST /v1/tasks/complete -H "$J" --data-binary "{\"tasks\":[{\"id\":\"$TID\",\"result\":1},{\"id\":\"x\",\"error\":{\"kind\":\"NO\"}}]}"
check "one bad item fails the whole batch (422 /tasks/1/error/kind) and ends nothing" pointer_is 422 /tasks/1/error/kind
req GET "/v1/jobs/$JOB"
check "none of that ended the task" py "assert j['state']=='running'"
req POST "/v1/tasks/$TID/complete" -H "$J" --data-binary '{"result":{"fine":true}}'
check "the real worker still completes it" status_is 200
req GET "/v1/jobs/$JOB?wait=10s"
check "and the job has its result" py "assert j['state']=='succeeded' and j['output']=={'fine':True}"
# A worker that gives up on its claim (a timeout, a crash) while it is
# parked: the next task must not be handed to the closed connection, where
# it would sit claimed by nobody until its lease ran out.
req PUT /v1/commands/gone -H "$J" --data-binary '{}'
curl -s -m 1 -o /dev/null -X POST "$BASE/v1/tasks/claim" -H "$J" \
    --data-binary '{"commands":["gone"],"worker":"quitter","wait_ms":30000,"lease_ms":60000}'
req POST /v1/jobs -H "$J" --data-binary '{"handler":"gone","args":{"n":1}}'
GJOB=$(location_id)
claim '{"commands":["gone"],"worker":"stayer","wait_ms":5000,"lease_ms":60000}'
check "a task is not handed to a claim whose client left: the next claim gets it" \
    py "assert [t['job_id'] for t in j['tasks']]==['$GJOB'] and j['tasks'][0]['attempt']==1"
req GET /livez
check "the server is still up" status_is 200

stop_server
finish
