#!/usr/bin/env bash
# Remote tasks across cluster nodes (issue 16 with issue 13): two jackdawd
# nodes on one throwaway PostgreSQL, --lease 2s. Jobs submitted on A whose
# command a worker claims only from B succeed; heartbeat, complete and fail
# on B reach A's tasks and A's answers come back verbatim (409s included);
# a claim parked on B is woken by a task arriving on A; `jackdaw work`
# against B alone serves A's jobs; hostile task ids and a node URL that does
# not answer get clean answers; SIGKILL A while a worker on B holds its task:
# the worker's complete gets 409 lease_lost, B takes the job over, offers
# the step again as attempt 2, and the result is recorded once (SQL).
# Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=tests/pg/pg.sh
. tests/pg/pg.sh

pg_test_start kill_all
J='Content-Type: application/json'

NODES=()
BG=()
HERD=()
kill_all() {
    local p
    for p in "${BG[@]}" "${NODES[@]}"; do kill -KILL "$p" 2>/dev/null; done
}

NODE_FLAGS=(--lease 2s) # start_node (lib.sh)
py() { python3 -c "import json,sys; j=json.loads(sys.stdin.read()); $1" "${@:2}" <<<"$BODY"; }
# until_ok SECONDS cmd...: retry every 0.1 s
until_ok() {
    local end=$((SECONDS + $1))
    shift
    while [ $SECONDS -le $end ]; do
        "$@" && return 0
        sleep 0.1
    done
    return 1
}

start_node A || exit 1
start_node B || exit 1
NODE_A=$(sql "SELECT id FROM jd_nodes WHERE url = '$BASE_A'")
NODE_B=$(sql "SELECT id FROM jd_nodes WHERE url = '$BASE_B'")
check "each node advertises its URL in its node row" eval '[ -n "$NODE_A" ] && [ -n "$NODE_B" ]'

on A req PUT /v1/commands/rc -H "$J" -d '{"description":"served from B"}'
check "command registered on A" status_is 201
known_on_b() { on B req GET /v1/commands/rc && status_is 200; }
check "B learns the command registered on A (within seconds)" until_ok 10 known_on_b

# a command registered on A and deleted there: B drops it too (checked
# near the end, a few seconds later)
on A req PUT /v1/commands/gone -H "$J" -d '{}'
known_gone() { on B req GET /v1/commands/gone && status_is 200; }
check "B learns a second command" until_ok 10 known_gone
on A req DELETE /v1/commands/gone
check "deleted on A" status_is 204

# claim_on_b [wait_ms] [worker]: one task for rc, claimed through B
claim_on_b() {
    on B json_post /v1/tasks/claim "{\"commands\":[\"rc\"],\"worker\":\"${2:-wb}\",\"wait_ms\":${1:-5000},\"lease_ms\":5000}"
    TASK=$(py 'print(j["tasks"][0]["id"] if j.get("tasks") else "")' 2>/dev/null)
}

# ---- a job on A, its task claimed, heartbeated and completed on B ----
on A json_post /v1/jobs '{"handler":"rc","args":{"n":1}}'
J1=$(location_id)
claim_on_b 5000
check "a claim on B gets the task of A's job" eval '[ -n "$TASK" ] && body_has "\"job_id\":\"$J1\""'
check "its id names A's node" eval '[[ "$TASK" == "$NODE_A."* ]]'
on B json_post "/v1/tasks/$TASK/heartbeat" '{"progress":{"pct":50}}'
check "heartbeat on B for A's task: 200 with the new deadline" \
    eval 'status_is 200 && body_has lease_expires_at'
on A req GET "/v1/jobs/$J1"
check "the progress shows on the job (A holds it)" body_has '"pct":50'
on B json_post "/v1/tasks/$TASK/complete" '{"result":{"done":"on B"}}'
check "complete on B: 200" eval 'status_is 200 && body_has "\"ok\":true"'
on B wait_job "$J1" 10s
check "A's job succeeded with B's result" eval 'body_has "\"state\":\"succeeded\"" && body_has "\"done\":\"on B\""'
on B json_post "/v1/tasks/$TASK/complete" '{"result":{"again":true}}'
check "completed twice: A's 409 completed, relayed" \
    eval 'status_is 409 && body_has "\"reason\":\"completed\"" && header_has "application/problem+json"'
on A req GET "/v1/jobs/$J1"
check "the first result stands" body_has '"done":"on B"'

# ---- fail on B ----
on A json_post /v1/jobs '{"handler":"rc","args":{"n":2}}'
J2=$(location_id)
claim_on_b 5000
on B json_post "/v1/tasks/$TASK/fail" '{"error":{"message":"no","kind":"refused","retryable":false}}'
check "fail on B: 200" status_is 200
on B wait_job "$J2" 10s
check "A's job failed with B's error" eval 'body_has "\"state\":\"failed\"" && body_has "refused"'
on B json_post "/v1/tasks/$TASK/fail" '{"error":{"message":"no"}}'
check "failed twice: 409 relayed" eval 'status_is 409 && body_has "\"reason\":\"completed\""'
on B json_post "/v1/tasks/$TASK/fail" '{"error":{"kind":"NOT A WORD"}}'
check "a bad body for A's task: A's 422 with its pointer, relayed" \
    eval 'is_problem 422 && body_has "\"pointer\":\"/error/kind\""'

# ---- one claim on B takes B's task and A's; one batch on B ends them all ----
on A json_post /v1/jobs '{"handler":"rc","args":{"n":5}}'
JA1=$(location_id)
on A json_post /v1/jobs '{"handler":"rc","args":{"n":6}}'
JA2=$(location_id)
on B json_post /v1/jobs '{"handler":"rc","args":{"n":7}}'
JB1=$(location_id)
sleep 0.5 # A's announcement reaches B
got=()
for _ in 1 2 3 4 5; do
    on B json_post /v1/tasks/claim "{\"commands\":[\"rc\"],\"worker\":\"wb\",\"max\":3,\"wait_ms\":2000,\"lease_ms\":5000}"
    mapfile -t more < <(py 'print("\n".join(t["id"] for t in j["tasks"]))')
    got+=("${more[@]}")
    [ "${#got[@]}" -ge 3 ] && break
done
check "claims on B with max 3 took B's task and both of A's (${#got[@]})" eval '[ "${#got[@]}" = 3 ]'
batch=$(printf '{"id":"%s","result":{"batch":true}},' "${got[@]}")
on B json_post /v1/tasks/complete "{\"tasks\":[${batch}{\"id\":\"$NODE_A.0123456789abcdef0123456789abcdef\",\"result\":1}]}"
check "a batch on B ends its own and A's tasks: 200, 200, 200 and 404 for an id A never made" \
    eval 'status_is 200 && py "assert [r[\"status\"] for r in j[\"results\"]] == [200, 200, 200, 404], j"'
check "... in order, by id" eval 'py "assert [r[\"id\"] for r in j[\"results\"]][:3] == sys.argv[1:], j" "${got[@]}"'
fin=0
for jb in "$JA1" "$JA2" "$JB1"; do
    on B wait_job "$jb" 10s
    body_has '"batch":true' && fin=$((fin + 1))
done
check "all three jobs succeeded with the batch's result ($fin)" eval '[ "$fin" = 3 ]'
on B json_post /v1/tasks/complete "{\"tasks\":[{\"id\":\"${got[0]}\",\"result\":1},{\"id\":\"x\",\"error\":{\"kind\":\"BAD\"}}]}"
check "a batch with a bad item ends none: 422 with its pointer" \
    eval 'is_problem 422 && body_has "/tasks/1/error/kind"'

# ---- a cancelled job ----
on A json_post /v1/jobs '{"handler":"rc","args":{"n":3}}'
J3=$(location_id)
claim_on_b 5000
on A req POST "/v1/jobs/$J3/cancel"
on A wait_job "$J3" 10s
on B json_post "/v1/tasks/$TASK/heartbeat" '{}'
check "heartbeat for a cancelled job's task: 409 cancelled" \
    eval 'status_is 409 && body_has "\"reason\":\"cancelled\""'
on B json_post "/v1/tasks/$TASK/complete" '{"result":1}'
check "complete for it: 409 cancelled" eval 'status_is 409 && body_has "\"reason\":\"cancelled\""'

# ---- a claim parked on B is woken by a task arriving on A ----
curl -s -o "$WORK/parked" -w '%{time_total}' --max-time 30 -H "$J" \
    -d '{"commands":["rc"],"worker":"parked","wait_ms":20000,"lease_ms":5000}' \
    "$BASE_B/v1/tasks/claim" >"$WORK/parked.time" &
PARKED=$!
BG+=("$PARKED")
sleep 0.5
on A json_post /v1/jobs '{"handler":"rc","args":{"n":4}}'
J4=$(location_id)
wait "$PARKED"
BODY=$(cat "$WORK/parked")
TASK=$(py 'print(j["tasks"][0]["id"] if j.get("tasks") else "")' 2>/dev/null)
took=$(cat "$WORK/parked.time")
check "the parked claim on B got A's new task (in ${took}s), well before its wait ended" \
    eval '[ -n "$TASK" ] && body_has "\"job_id\":\"$J4\"" && python3 -c "import sys; sys.exit(0 if float(\"$took\") < 15 else 1)"'
on B json_post "/v1/tasks/$TASK/complete" '{"result":"woken"}'
on A wait_job "$J4" 10s
check "that job succeeded" body_has '"state":"succeeded"'

# ---- one task on A wakes one of 8 claims parked on B, not all 8 ----
forwards() {
    on B req GET /metrics
    sed -n "s/^jackdaw_cluster_task_forwards_total{node=\"$NODE_B\",kind=\"claim\"} //p" <<<"$BODY"
}
sleep 3.5 # earlier announcements lapse (3 s): each new claim would ask A once at its start
before=$(forwards)
for k in 1 2 3 4 5 6 7 8; do
    curl -s -o "$WORK/herd.$k" --max-time 30 -H "$J" \
        -d "{\"commands\":[\"rc\"],\"worker\":\"herd$k\",\"wait_ms\":4000,\"lease_ms\":5000}" \
        "$BASE_B/v1/tasks/claim" &
    BG+=("$!")
    HERD+=("$!")
done
sleep 0.5
on A json_post /v1/jobs '{"handler":"rc","args":{"n":8}}'
J8=$(location_id)
for p in "${HERD[@]}"; do wait "$p"; done
after=$(forwards)
won=$(cat "$WORK"/herd.* | grep -c '"job_id"')
check "one parked claim got the task ($won)" eval '[ "$won" = 1 ]'
check "B asked A $((after - before)) times for it, not once per parked claim" \
    eval '[ $((after - before)) -ge 1 ] && [ $((after - before)) -le 3 ]'
BODY=$(cat "$WORK"/herd.* | grep '"job_id"')
TASK=$(py 'print(j["tasks"][0]["id"])')
on B json_post "/v1/tasks/$TASK/complete" '{"result":"herd"}'
on A wait_job "$J8" 10s
check "that job succeeded" body_has '"state":"succeeded"'

on A req GET /v1/workers
check "GET /v1/workers on A lists the workers that only called B" \
    py "names=[w['name'] for w in j['workers']]; assert all(('herd%d' % k) in names for k in range(1, 9)), names"
check "... and a worker seen by both nodes once" \
    py "assert [w['name'] for w in j['workers']].count('wb') == 1"

# ---- `jackdaw work` against B alone serves A's jobs ----
cat >"$WORK/double.sh" <<'SH'
#!/bin/sh
python3 -c 'import json,sys; a=json.load(sys.stdin); print(json.dumps({"twice": a["n"]*2}))'
SH
chmod +x "$WORK/double.sh"
"$BUILD/jackdaw" --url "$BASE_B" work --command rc --concurrency 2 -- "$WORK/double.sh" \
    >"$WORK/work.log" 2>&1 &
BG+=("$!")
WORKER=$!
ids=()
for i in 1 2 3 4 5 6; do
    on A json_post /v1/jobs "{\"handler\":\"rc\",\"args\":{\"n\":$i}}"
    ids+=("$(location_id)")
done
good=0
for i in 1 2 3 4 5 6; do
    on A wait_job "${ids[$((i - 1))]}" 20s
    body_has "\"twice\":$((i * 2))" && good=$((good + 1))
done
check "jackdaw work on B ran all 6 of A's jobs ($good)" eval '[ "$good" = 6 ]'
kill -TERM "$WORKER" 2>/dev/null
wait "$WORKER" 2>/dev/null
on B req GET /metrics
check "B counts its forwarded claims and requests" \
    eval 'body_has "jackdaw_cluster_task_forwards_total{node=\"$NODE_B\",kind=\"claim\"}" && body_has "kind=\"relay\""'

# ---- hostile ids and a node that does not answer ----
HEX=0123456789abcdef0123456789abcdef
on B json_post "/v1/tasks/999999999.$HEX/complete" '{"result":1}'
check "an id naming no node: 404" status_is 404
on B json_post "/v1/tasks/99999999999999999999999.$HEX/complete" '{"result":1}'
check "an id naming a node past 2^63: 404" status_is 404
on B json_post "/v1/tasks/$NODE_A.$HEX/heartbeat" '{}'
check "an id A never handed out, through B: A's 404" status_is 404
# a live node row whose URL accepts connections and never answers
python3 -c '
import socket, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(64)
print(s.getsockname()[1], flush=True)
time.sleep(60)' >"$WORK/hole.port" &
BG+=("$!")
until_ok 5 test -s "$WORK/hole.port"
HOLE=$(head -n 1 "$WORK/hole.port")
FAKE=$(sql "INSERT INTO jd_nodes(name, started_at, expires_at, url) VALUES ('fake', now(), now() + interval '1 hour', 'http://127.0.0.1:$HOLE') RETURNING id" | head -n 1)
# a task the silent node holds (claimed), and one whose end is stored
sql "INSERT INTO tasks(id, job_id, tag, attempt, command, state, worker, lease_expires_ms, updated_ms) VALUES ('$FAKE.$HEX', 999999, 1, 1, 'rc', 1, 'w', 0, 0), ('$FAKE.${HEX%?}e', 999999, 2, 1, 'rc', 2, 'w', 0, 0)" >/dev/null
on B json_post "/v1/tasks/$FAKE.${HEX%?}e/complete" '{"result":1}'
check "a silent node's task whose end is stored: 409 completed from the store" \
    eval 'status_is 409 && body_has "\"reason\":\"completed\""'
on B json_post "/v1/tasks/$FAKE.${HEX%?}d/complete" '{"result":1}'
check "an id the silent node never handed out: 404" status_is 404
start=$SECONDS
for k in 1 2 3 4 5 6; do
    curl -s -o /dev/null --max-time 20 -H "$J" -d '{"result":1}' \
        "$BASE_B/v1/tasks/$FAKE.$HEX/complete" &
    BG+=("$!")
done
on B json_post "/v1/tasks/$FAKE.$HEX/complete" '{"result":1}'
check "a live node that does not answer: 503 with Retry-After" \
    eval 'is_problem 503 && header_has "Retry-After"'
check "... within the forward timeout ($((SECONDS - start))s)" eval '[ $((SECONDS - start)) -le 10 ]'
on B req GET /livez
check "B still answers meanwhile" status_is 200
sql "DELETE FROM jd_nodes WHERE id = $FAKE; DELETE FROM tasks WHERE job_id = 999999" >/dev/null

# ---- SIGKILL A while a worker on B holds its task ----
on A json_post /v1/jobs '{"handler":"rc","args":{"n":9}}'
JK=$(location_id)
claim_on_b 5000 holder
check "the worker on B holds A's task (attempt 1)" body_has '"attempt":1'
{
    kill -KILL "$PID_A"
    wait "$PID_A"
} 2>/dev/null
lost() {
    on B json_post "/v1/tasks/$TASK/complete" '{"result":"too late"}'
    status_is 409
}
check "the worker's complete on B: 409 once A's lease lapsed" until_ok 15 lost
check "... reason lease_lost" body_has '"reason":"lease_lost"'
again() {
    claim_on_b 1000 second
    [ -n "$TASK" ]
}
check "B took the job over and offers the step again" until_ok 15 again
check "... as attempt 2" body_has '"attempt":2'
check "... with an id of B's" eval '[[ "$TASK" == "$NODE_B."* ]]'
on B json_post "/v1/tasks/$TASK/complete" '{"result":{"by":"second"}}'
check "its complete: 200" status_is 200
on B wait_job "$JK" 10s
check "the job succeeded with the second worker's result" \
    eval 'body_has "\"state\":\"succeeded\"" && body_has "\"by\":\"second\""'
check "its result is recorded once, the late one not at all" \
    eval '[ "$(sql "SELECT count(*) FROM events_all WHERE job_id = $JK AND data LIKE '"'"'%by%second%'"'"'")" -ge 1 ] && [ "$(sql "SELECT count(*) FROM events_all WHERE job_id = $JK AND data LIKE '"'"'%too late%'"'"'")" = 0 ]'

dropped() { on B req GET /v1/commands/gone && status_is 404; }
check "B dropped the command deleted on A" until_ok 10 dropped

# ---- a clean stop of B: its forwarding threads stop, nothing leaks ----
kill -TERM "$PID_B"
wait "$PID_B"
rc=$?
check "B stops cleanly (exit $rc), no sanitizer report" \
    eval '[ "$rc" = 0 ] && ! grep -q Sanitizer "$WORK/node.B.log"'
finish
