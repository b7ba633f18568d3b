#!/usr/bin/env bash
# Remote commands and their tasks against the real server: registering a
# command, claim/complete/fail, the job's retry policy, long-poll claims,
# lease expiry, cancel while claimed, the 409s a worker gets when a task
# is no longer its own (with the reason), DELETE refused while jobs use a
# command, and a kill -9 while tasks are claimed and waiting: after the
# restart the old ids answer 409 lease_lost, the calls are offered again
# as attempt + 1, and each result is recorded once.
#
# With JD_TEST_DB (PostgreSQL) the node is one of a cluster: after kill -9
# the restarted node takes the killed incarnation's jobs back only when that
# incarnation's node lease has lapsed, and until then a task it had claimed
# answers 503 (its owner may still be alive) — so there the server runs with
# a short --lease and the test waits for the takeover; the final answer is
# the same 409 lease_lost. On SQLite the first answer must be the 409.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

PGLEASE=()
[ -n "${JD_TEST_DB:-}" ] && PGLEASE=(--lease 2s)
start_server "${PGLEASE[@]}" || exit 1

J='Content-Type: application/json'
py() { python3 -c "import json,re,sys; j=json.loads(sys.stdin.read()); $1" <<<"$BODY"; }
jq_() { python3 -c "import json,sys; j=json.loads(sys.stdin.read()); print($1)" <<<"$BODY"; }
submit() { req POST /v1/jobs -H "$J" --data-binary "$1"; JOB=$(jq_ "j['id']" 2>/dev/null); }
claim() { req POST /v1/tasks/claim -H "$J" --data-binary "$1" "${@:2}"; }
task_id() { jq_ "j['tasks'][0]['id']"; }

# ---- the command registry ----
req PUT /v1/commands/resize -H "$J" --data-binary '{"description":"make it smaller"}'
check "PUT a new remote command: 201 + Location" eval 'status_is 201 && header_has "Location: /v1/commands/resize"'
req PUT /v1/commands/resize -H "$J" --data-binary '{"description":"make it smaller","timeout_ms":0}'
check "PUT again: 200 (idempotent)" status_is 200
req GET /v1/commands/resize
check "GET the command" eval 'status_is 200 && py "assert j[\"kind\"]==\"remote\" and j[\"waiting\"]==0 and j[\"description\"]==\"make it smaller\""'
req GET /v1/commands
check "the list has plugin and remote commands" py "n={c['name']:c['kind'] for c in j['commands']}; assert n['resize']=='remote' and n['echo']=='plugin'"
req PUT /v1/commands/echo -H "$J" --data-binary '{}'
check "a plugin's name cannot be a remote command: 409" eval 'is_problem 409'
submit '{"handler":"unregistered_cmd","args":{}}'
check "a job naming an unregistered command: 422 /handler" eval 'is_problem 422 && body_has "\"pointer\":\"/handler\""'
req GET /v1/commands/nope
check "GET an unknown command: 404" is_problem 404

# ---- claim, complete ----
submit '{"handler":"resize","args":{"w":640}}'
J1=$JOB
req GET "/v1/jobs/$J1/events"
check "a waiting task has no dispatch in its job's history" py "assert [e for e in j['events'] if e['kind']=='dispatch']==[]"
claim '{"commands":["resize"],"worker":"t/1","max":10,"lease_ms":30000}'
check "claim answers the task with its fields" py "t=j['tasks'][0]; assert len(j['tasks'])==1 and t['command']=='resize' and t['args']=={'w':640} and t['job_id']=='$J1' and t['attempt']==1 and t['idempotency_key']=='$J1:1' and re.fullmatch(r'([1-9][0-9]*[.])?$J1-[1-9][0-9]*-[0-9a-f]{32}', t['id']) and t['lease_expires_at']"
T1=$(task_id)
req GET "/v1/jobs/$J1/events"
check "its claim is the dispatch: attempt, args, task (the id less its seq, the event's), worker and lease" py "d=[e for e in j['events'] if e['kind']=='dispatch']; assert len(d)==1 and d[0]['tag']==1 and d[0]['data']['attempt']==1 and d[0]['data']['args']=={'w':640} and d[0]['data']['task'][:-32]+'%d-' % d[0]['seq']+d[0]['data']['task'][-32:]=='$T1' and re.fullmatch(r'([1-9][0-9]*[.])?$J1-[0-9a-f]{32}', d[0]['data']['task']) and d[0]['data']['worker']=='t/1' and d[0]['data']['lease_expires_ms']>0, d"
req GET /v1/commands/resize
check "the command shows one in flight" py "assert j['in_flight']==1 and j['waiting']==0"
claim '{"commands":["resize"]}'
check "nothing more waiting: an empty list at once" py "assert j=={'tasks':[]}"
req POST "/v1/tasks/$T1/complete" -H "$J" --data-binary '{"result":{"w":320}}'
check "complete: 200" eval 'status_is 200 && body_has "\"ok\":true"'
wait_job "$J1"
check "the job succeeded with the worker's result" py "assert j['state']=='succeeded' and j['output']=={'w':320}"
req POST "/v1/tasks/$T1/complete" -H "$J" --data-binary '{"result":1}'
check "complete again: 409 reason completed" eval 'is_problem 409 && py "assert j[\"reason\"]==\"completed\" and j[\"type\"]==\"urn:jackdaw:problem:completed\""'
req POST "/v1/tasks/$T1/fail" -H "$J" --data-binary '{"error":{"message":"x"}}'
check "fail after complete: 409 completed" eval 'is_problem 409 && body_has completed'
req POST /v1/tasks/0123456789abcdef0123456789abcdef/complete -H "$J" --data-binary '{}'
check "an id never handed out: 404" is_problem 404

# ---- fail: retryable goes by the job's retry policy ----
submit '{"handler":"resize","args":{"w":1},"retry":{"max_attempts":2,"backoff_ms":10}}'
J2=$JOB
claim '{"commands":["resize"],"wait_ms":5000}'
T=$(task_id)
req POST "/v1/tasks/$T/fail" -H "$J" --data-binary '{"error":{"message":"busy","kind":"overloaded","retryable":true}}'
check "fail (retryable): 200" status_is 200
claim '{"commands":["resize"],"wait_ms":5000}'
check "the retry is offered as attempt 2, same idempotency key" py "t=j['tasks'][0]; assert t['attempt']==2 and t['idempotency_key']=='$J2:1'"
T=$(task_id)
req POST "/v1/tasks/$T/fail" -H "$J" --data-binary '{"error":{"message":"no such image","kind":"not_found","retryable":true,"details":{"path":"/x"}}}'
wait_job "$J2"
check "attempts exhausted: the job failed with the worker's error" py "e=j['error']; assert j['state']=='failed' and 'no such image' in json.dumps(e) and 'not_found' in json.dumps(e)"
submit '{"handler":"resize","args":{},"retry":{"max_attempts":5,"backoff_ms":10}}'
J3=$JOB
claim '{"commands":["resize"],"wait_ms":5000}'
T=$(task_id)
req POST "/v1/tasks/$T/fail" -H "$J" --data-binary '{"error":{"message":"bad input","kind":"invalid","retryable":false}}'
wait_job "$J3"
check "a non-retryable failure fails the job at once" py "assert j['state']=='failed' and 'bad input' in json.dumps(j['error'])"

# ---- long-poll ----
(sleep 0.5; curl -s -o /dev/null -H "$J" --data-binary '{"handler":"resize","args":{"lp":1}}' "$BASE/v1/jobs") &
LP=$!
claim '{"commands":["resize"],"wait_ms":10000}'
check "a parked claim gets the task that arrives" py "assert j['tasks'][0]['args']=={'lp':1}"
wait "$LP"
T=$(task_id)
req POST "/v1/tasks/$T/complete" -H "$J" --data-binary '{"result":null}'
check "and completes it" status_is 200
claim '{"commands":["resize"],"wait_ms":300}'
check "a claim whose wait ends: 200 with no tasks" eval 'status_is 200 && py "assert j=={\"tasks\":[]}"'

# ---- lease expiry ----
submit '{"handler":"resize","args":{"lease":1},"retry":{"max_attempts":3,"backoff_ms":10}}'
J4=$JOB
claim '{"commands":["resize"],"lease_ms":1000}'
T=$(task_id)
sleep 2.5
req POST "/v1/tasks/$T/complete" -H "$J" --data-binary '{"result":1}'
check "after the lease ran out: 409 lease_lost" eval 'is_problem 409 && py "assert j[\"reason\"]==\"lease_lost\""'
claim '{"commands":["resize"],"wait_ms":5000}'
check "the call is offered again as attempt 2" py "assert j['tasks'][0]['attempt']==2 and j['tasks'][0]['job_id']=='$J4'"
T=$(task_id)
req POST "/v1/tasks/$T/complete" -H "$J" --data-binary '{"result":"late but fine"}'
wait_job "$J4"
check "the second worker's result is the job's" py "assert j['state']=='succeeded' and j['output']=='late but fine'"
submit '{"handler":"resize","args":{"lease":2}}'
J5=$JOB
claim '{"commands":["resize"],"lease_ms":1000}'
wait_job "$J5" 10s
check "without retries, an expired lease fails the job with lease_expired" py "assert j['state']=='failed' and j['error']['kind']=='lease_expired' and j['error']['retryable'] is True"

# ---- cancel while claimed ----
submit '{"handler":"resize","args":{"cancel":1}}'
J6=$JOB
claim '{"commands":["resize"]}'
T=$(task_id)
req POST "/v1/jobs/$J6/cancel"
wait_job "$J6"
check "the claimed job is cancelled" py "assert j['state']=='cancelled'"
req POST "/v1/tasks/$T/complete" -H "$J" --data-binary '{"result":1}'
check "completing a cancelled job's task: 409 cancelled" eval 'is_problem 409 && py "assert j[\"reason\"]==\"cancelled\""'
req GET /v1/commands/resize
check "nothing left waiting or in flight" py "assert j['waiting']==0 and j['in_flight']==0"

# ---- DELETE while used ----
req PUT /v1/commands/thumb -H "$J" --data-binary '{}'
submit '{"steps":[{"id":"a","call":"thumb","args":{}}]}'
J7=$JOB
req DELETE /v1/commands/thumb
check "DELETE while a job uses the command: 409" is_problem 409
claim '{"commands":["thumb"],"wait_ms":5000}'
T=$(task_id)
req POST "/v1/tasks/$T/complete" -H "$J" --data-binary '{"result":{"t":1}}'
wait_job "$J7"
req DELETE /v1/commands/thumb
check "DELETE once no job uses it: 204" status_is 204
req GET /v1/commands/thumb
check "and it is gone" is_problem 404
submit '{"steps":[{"id":"a","call":"thumb","args":{}}]}'
check "a job naming it again: 422" eval 'is_problem 422 && body_has "/steps/0/call"'

# ---- many ends in one request ----
for n in 1 2 3; do submit "{\"handler\":\"resize\",\"args\":{\"b\":$n}}"; done
claim '{"commands":["resize"],"max":3,"wait_ms":5000}'
check "a batch of three claimed" py "assert len(j['tasks'])==3"
BATCH=$(python3 -c "import json,sys; t=json.loads(sys.stdin.read())['tasks']
print(json.dumps({'tasks':[{'id':t[0]['id'],'result':{'ok':t[0]['args']['b']}},
                           {'id':t[1]['id'],'error':{'message':'no','kind':'bad'}},
                           {'id':t[0]['id'],'result':'twice'},
                           {'id':'f'*32,'result':1},
                           {'id':t[2]['id']}]}))" <<<"$BODY")
BJOBS=$(py "print(' '.join(t['job_id'] for t in j['tasks']))")
req POST /v1/tasks/complete -H "$J" --data-binary "$BATCH"
check "batch complete: per task 200, 200, 409 completed, 404, 200" py "r=j['results']; assert [x['status'] for x in r]==[200,200,409,404,200] and r[2]['reason']=='completed'"
set -- $BJOBS
wait_job "$1"
check "the batch's first job has its result" py "assert j['state']=='succeeded' and j['output']['ok'] in (1,2,3)"
wait_job "$2"
check "the batch's failed one failed" py "assert j['state']=='failed' and j['error']['kind']=='bad'"
wait_job "$3"
check "an item with neither result nor error completes with null" py "assert j['state']=='succeeded' and j['output'] is None"

# ---- heartbeat, progress, workers, metrics ----
submit '{"handler":"resize","args":{"hb":1}}'
JH=$JOB
claim '{"commands":["resize"],"worker":"hb-worker","lease_ms":2000}'
T=$(task_id)
for i in 1 2 3 4 5 6; do
    sleep 0.5
    req POST "/v1/tasks/$T/heartbeat" -H "$J" --data-binary "{\"progress\":{\"pct\":$((i * 20))}}"
done
check "heartbeats keep a 2 s lease alive past 3 s" eval 'status_is 200 && body_has lease_expires_at'
# A long lease from here on: the checks below must not race its expiry on a
# loaded machine.
req POST "/v1/tasks/$T/heartbeat" -H "$J" --data-binary '{"lease_ms":60000}'
check "a heartbeat may set a longer lease" status_is 200
req GET "/v1/jobs/$JH"
check "the job shows the latest progress" py "assert j['state']=='running' and j['progress']=={'pct':120}"
req GET "/v1/jobs/$JH/events"
check "progress is in the history, at most once a second" py "p=[e for e in j['events'] if e['kind']=='progress']; assert 1<=len(p)<=4 and p[0]['data']['task']=='$T' and p[0]['data']['worker']=='hb-worker', p"
req GET /v1/workers
check "GET /v1/workers shows the worker, its commands and its task" py "w=[w for w in j['workers'] if w['name']=='hb-worker'][0]; assert w['in_flight']==1 and w['commands']==['resize'] and w['last_seen_at']"
req GET /metrics
for m in 'jackdaw_tasks_in_flight{command="resize"} 1' 'jackdaw_tasks_waiting{command="resize"} 0' \
    'jackdaw_tasks_claimed_total{command="resize"}' 'jackdaw_tasks_lease_expired_total{command="resize"} 2' \
    'jackdaw_task_claim_to_end_seconds_bucket{command="resize",le="+Inf"}'; do
    check "metrics: $m" body_has "$m"
done
req POST "/v1/tasks/$T/complete" -H "$J" --data-binary '{"result":"done"}'
wait_job "$JH"
check "after it ends the job has no progress" py "assert j['state']=='succeeded' and 'progress' not in j"
req POST "/v1/tasks/$T/heartbeat" -H "$J" --data-binary '{}'
check "a heartbeat after complete: 409 completed" eval 'is_problem 409 && py "assert j[\"reason\"]==\"completed\""'
req GET /v1/workers
check "the worker has nothing in flight now" py "w=[w for w in j['workers'] if w['name']=='hb-worker'][0]; assert w['in_flight']==0"
submit '{"handler":"resize","args":{"hb":2}}'
JC=$JOB
claim '{"commands":["resize"],"lease_ms":30000}'
T=$(task_id)
req POST "/v1/jobs/$JC/cancel"
req POST "/v1/tasks/$T/heartbeat" -H "$J" --data-binary '{"progress":1}'
check "a cancelled job's heartbeat: 409 cancelled (the worker can stop)" eval 'is_problem 409 && py "assert j[\"reason\"]==\"cancelled\""'

# ---- kill -9 with tasks claimed and waiting ----
req PUT /v1/commands/crashy -H "$J" --data-binary '{}'
submit '{"handler":"crashy","args":{"n":1}}'
K1=$JOB
submit '{"handler":"crashy","args":{"n":2}}'
K2=$JOB
submit '{"steps":[{"id":"a","call":"crashy","args":{"n":3}},{"id":"b","call":"crashy","args":{"n":4}}]}'
K3=$JOB
claim '{"commands":["crashy"],"max":1,"worker":"doomed"}'
OLD=$(task_id)
check "one task claimed before the crash" py "assert j['tasks'][0]['job_id']=='$K1'"
claim '{"commands":["crashy"],"max":1}'
C2=$(task_id)
check "a second one claimed and completed before the crash" py "assert j['tasks'][0]['job_id']=='$K2'"
req POST "/v1/tasks/$C2/complete" -H "$J" --data-binary '{"result":"once"}'
stop_server KILL
start_server --grace 120s "${PGLEASE[@]}" || exit 1
req POST "/v1/tasks/$OLD/complete" -H "$J" --data-binary '{"result":"from the dead"}'
if [ -n "${JD_TEST_DB:-}" ]; then
    # 503 (with Retry-After) while the killed incarnation's lease lasts,
    # then the 409; 60 s is many 2 s leases even on a loaded machine.
    N503=0
    for _ in $(seq 120); do
        [ "$STATUS" = 503 ] || break
        N503=$((N503 + 1))
        header_has "Retry-After" || break
        sleep 0.5
        req POST "/v1/tasks/$OLD/complete" -H "$J" --data-binary '{"result":"from the dead"}'
    done
    echo "# the old id answered 503 $N503 times before the takeover"
fi
check "after the restart the old claimed id answers 409 lease_lost" eval 'is_problem 409 && py "assert j[\"reason\"]==\"lease_lost\""'
req POST "/v1/tasks/$C2/complete" -H "$J" --data-binary '{"result":"twice"}'
check "and the completed one 409 completed" eval 'is_problem 409 && py "assert j[\"reason\"]==\"completed\""'
req GET /v1/commands/crashy
check "the command survived the restart" status_is 200
claim '{"commands":["crashy"],"max":10,"wait_ms":5000}'
check "every unfinished call is offered again, none that completed" py "a=sorted(t['args']['n'] for t in j['tasks']); assert a==[1,3], a"
check "the claimed one as attempt 2 (same key)" py "t=[t for t in j['tasks'] if t['args']['n']==1][0]; assert t['attempt']==2 and t['idempotency_key']=='$K1:1'"
check "the waiting one waits again as attempt 1" py "t=[t for t in j['tasks'] if t['args']['n']==3][0]; assert t['attempt']==1"
complete_all() {
    local n i id
    n=$(jq_ "len(j['tasks'])")
    for ((i = 0; i < n; i++)); do
        id=$(jq_ "j['tasks'][$i]['id']")
        curl -s -o /dev/null -H "$J" --data-binary '{"result":"again"}' "$BASE/v1/tasks/$id/complete"
    done
}
complete_all
req POST "/v1/tasks/$OLD/complete" -H "$J" --data-binary '{"result":"from the dead"}'
check "once attempt 2 completed, the old attempt's id still answers 409 lease_lost" eval 'is_problem 409 && py "assert j[\"reason\"]==\"lease_lost\""'
claim '{"commands":["crashy"],"max":10,"wait_ms":5000}'
check "the workflow's next step follows" py "assert [t['args']['n'] for t in j['tasks']]==[4]"
complete_all
for k in "$K1" "$K2" "$K3"; do
    wait_job "$k"
    check "job $k succeeded after the restart" py "assert j['state']=='succeeded'"
done
wait_job "$K2"
check "a result recorded before the crash is kept, not asked for again" py "assert j['output']=='once'"
req GET "/v1/jobs/$K3/events"
check "each step's result is recorded exactly once" py "c=[e for e in j['events'] if e['kind']=='complete']; assert len(c)==2 and len({e['tag'] for e in c})==2"

# ---- a remote command's own cap on its calls in flight ----
req PUT /v1/commands/capped -H "$J" --data-binary '{"max_in_flight":-1}'
check "max_in_flight -1: 422 at /max_in_flight" eval 'is_problem 422 && body_has "\"pointer\":\"/max_in_flight\""'
for bad in '"4"' 2000000 1.5 '[1]' 99999999999999999999; do
    req PUT /v1/commands/capped -H "$J" --data-binary "{\"max_in_flight\":$bad}"
    check "max_in_flight $bad: 422 at /max_in_flight" eval 'is_problem 422 && body_has "\"pointer\":\"/max_in_flight\""'
done
req PUT /v1/commands/capped -H "$J" --data-binary '{"max_in_flight":1}'
check "max_in_flight is registered and shown" py "assert j['max_in_flight']==1"
for n in 1 2 3; do submit "{\"handler\":\"capped\",\"args\":{\"n\":$n}}"; done
sleep 0.5
claim '{"commands":["capped"],"max":10}'
check "at most max_in_flight of its calls are out at once" py "assert [t['args']['n'] for t in j['tasks']]==[1]"
complete_all
claim '{"commands":["capped"],"max":10,"wait_ms":5000}'
check "a finished call hands its place to the next, in order" py "assert [t['args']['n'] for t in j['tasks']]==[2]"
req PUT /v1/commands/capped -H "$J" --data-binary '{"max_in_flight":5}'
claim '{"commands":["capped"],"max":10,"wait_ms":5000}'
check "raising the cap lets the waiting call go at once" py "assert [t['args']['n'] for t in j['tasks']]==[3]"
stop_server
start_server --grace 120s || exit 1
req GET /v1/commands/capped
check "the cap survives a restart" py "assert j['max_in_flight']==5"
claim '{"commands":["capped"],"max":10,"wait_ms":5000}'
check "after the restart the unfinished calls are offered again" py "assert sorted(t['args']['n'] for t in j['tasks'])==[2,3]"
complete_all

# ---- SIGTERM with a task claimed: remote tasks do not hold the drain ----
submit '{"handler":"crashy","args":{"n":9}}'
claim '{"commands":["crashy"],"lease_ms":600000,"wait_ms":5000}'
check "a task is claimed at shutdown" py "assert len(j['tasks'])==1"
T0=$SECONDS
stop_server
check "SIGTERM with a claimed task: exit 0 well within --grace 120s" eval '[ "$SERVER_RC" = 0 ] && [ $((SECONDS - T0)) -lt 60 ]'

# ---- --worker-token: a second token that opens only the worker routes ----
start_server --token main-secret --worker-token worker-secret || exit 1
WT='Authorization: Bearer worker-secret'
MT='Authorization: Bearer main-secret'
req PUT /v1/commands/tokcmd -H "$J" -H "$WT" --data-binary '{}'
check "the worker token may PUT a command" status_is 201
req POST /v1/jobs -H "$J" -H "$MT" --data-binary '{"handler":"tokcmd","args":{}}'
check "the main token submits" status_is 201
claim '{"commands":["tokcmd"]}'
check "claim without a token: 401" is_problem 401
claim '{"commands":["tokcmd"],"wait_ms":5000}' -H "$WT"
check "the worker token claims" py "assert len(j['tasks'])==1"
T=$(task_id)
req POST "/v1/tasks/$T/heartbeat" -H "$J" -H "$WT" --data-binary '{}'
check "the worker token heartbeats" status_is 200
req POST "/v1/tasks/$T/complete" -H "$J" -H "$WT" --data-binary '{"result":1}'
check "the worker token completes" status_is 200
req GET /v1/jobs -H "$WT"
check "the worker token cannot list jobs: 403" is_problem 403
req POST /v1/jobs -H "$J" -H "$WT" --data-binary '{"handler":"echo"}'
check "nor submit: 403" is_problem 403
req DELETE /v1/commands/tokcmd -H "$WT"
check "nor delete a command: 403" is_problem 403
req GET /v1/workers -H "$MT"
check "the main token opens everything" status_is 200

stop_server
"$JACKDAWD" --listen 127.0.0.1:0 --db "$WORK/other.db" --worker-token w 2>"$WORK/wt.err"
WRC=$?
check "--worker-token without --token is refused at start" eval '[ $WRC -ne 0 ] && grep -q "needs --token" "$WORK/wt.err"'
finish
