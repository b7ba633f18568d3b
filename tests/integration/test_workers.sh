#!/usr/bin/env bash
# The example workers (examples/workers/python/worker.py, standard library
# only, and examples/workers/node/worker.mjs, Node's fetch) against a real
# server: they register their commands, jobs that call them succeed (one
# workflow uses both), failures reach the job (retryable ones retried),
# progress shows on the job, a traced job's traceparent reaches the
# handler, a worker SIGKILLed mid-task has its task
# offered again after the lease (attempt 2, served by another worker), and
# SIGTERM drains a worker to exit 0.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

PYW=examples/workers/python/worker.py
NODEW=examples/workers/node/worker.mjs
HAVE_NODE=0
command -v node >/dev/null && [ "$(node -p 'process.versions.node.split(".")[0]')" -ge 18 ] && HAVE_NODE=1

start_server || exit 1
J='Content-Type: application/json'
py() { python3 -c "import json,sys; j=json.loads(sys.stdin.read()); $1" <<<"$BODY"; }
submit() { req POST /v1/jobs -H "$J" --data-binary "$1"; JOB=$(py "print(j['id'])"); }
PIDS=()
# start_worker NAME CMD...: runs it with JACKDAW_URL set, log in $WORK/NAME.log
start_worker() {
    local name=$1
    shift
    JACKDAW_URL=$BASE "$@" 2>"$WORK/$name.log" &
    LAST=$!
    PIDS+=("$LAST")
}
# until_ok SECONDS cmd...: retry cmd every 0.1 s until it succeeds
until_ok() {
    local end=$((SECONDS + $1))
    shift
    until "$@"; do
        [ $SECONDS -lt $end ] || return 1
        sleep 0.1
    done
}
registered() { req GET "/v1/commands/$1" && status_is 200; }
in_flight() { req GET "/v1/commands/$1" && py "assert j['in_flight']==1" 2>/dev/null; }

start_worker py python3 "$PYW" --commands py.upper,py.fail --concurrency 2 --wait-ms 1000
PY=$LAST
check "the Python worker registers its commands" until_ok 10 registered py.fail
if [ $HAVE_NODE = 1 ]; then
    start_worker node node "$NODEW" --commands node.reverse,node.fail --wait-ms 1000
    NODE=$LAST
    check "the Node worker registers its commands" until_ok 10 registered node.fail
fi

submit '{"handler":"py.upper","args":{"text":"hello"}}'
wait_job "$JOB"
check "a job served by the Python worker succeeds" py "assert j['state']=='succeeded' and j['output']=={'text':'HELLO','by':'python'}"
submit '{"handler":"py.fail","args":{"message":"no such image"}}'
wait_job "$JOB"
check "a Python exception fails the step with its message" py "assert j['state']=='failed' and 'no such image' in j['error']['message']"
submit '{"handler":"py.fail","args":{"retryable":true},"retry":{"max_attempts":2,"backoff_ms":10}}'
wait_job "$JOB"
check "a retryable Python failure is retried, then fails" py "assert j['state']=='failed' and j['error']['kind']=='busy' and j['error']['attempt']==2"

if [ $HAVE_NODE = 1 ]; then
    submit '{"handler":"node.reverse","args":{"text":"hello"}}'
    wait_job "$JOB"
    check "a job served by the Node worker succeeds" py "assert j['state']=='succeeded' and j['output']=={'text':'olleh','by':'node'}"
    submit '{"steps":[{"id":"a","call":"py.upper","args":{"text":"${input.w}"}},
                      {"id":"b","call":"node.reverse","args":{"text":"${steps.a.output.text}"}}],
             "input":{"w":"jackdaw"}}'
    wait_job "$JOB"
    check "a workflow through both workers" eval 'py "assert j[\"state\"]==\"succeeded\"" && body_has WADKCAJ'
    submit '{"handler":"node.fail","args":{"message":"bad input"}}'
    wait_job "$JOB"
    check "a Node exception fails the step" py "assert j['state']=='failed' and 'bad input' in j['error']['message']"
else
    echo "# skip: no Node 18+ (the Node worker's checks)"
fi

# ---- the job's traceparent reaches the handler (the worker logs it) ----
TP=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
traced() { # lang command
    LANG_=$1 CMD_=$2
    req POST /v1/jobs -H "$J" -H "traceparent: $TP" --data-binary "{\"handler\":\"$2\",\"args\":{\"text\":\"t\"}}"
    JOB=$(py "print(j['id'])")
    wait_job "$JOB"
    check "$1: a traced job's task gives the handler its traceparent" \
        eval 'py "assert j[\"state\"]==\"succeeded\"" && grep -q "$CMD_ traceparent $TP" "$WORK/$LANG_.log"'
}
traced py py.upper
[ $HAVE_NODE = 1 ] && traced node node.reverse

# ---- a worker SIGKILLed mid-task: its task is offered again after the lease ----
kill_mid_task() { # lang cmd worker...
    local lang=$1 cmd=$2
    shift 2
    start_worker "$lang-victim" "$@" --commands "$cmd" --lease-ms 3000 --wait-ms 1000
    local victim=$LAST
    until_ok 10 registered "$cmd"
    submit "{\"handler\":\"$cmd\",\"args\":{\"first_seconds\":60,\"seconds\":0},\"retry\":{\"max_attempts\":3,\"backoff_ms\":10}}"
    local job=$JOB
    check "$lang: the victim holds the task" until_ok 10 in_flight "$cmd"
    req GET "/v1/jobs/$job"
    check "$lang: its progress shows on the job" until_ok 5 eval 'req GET "/v1/jobs/'"$job"'" && py "assert \"left_s\" in j[\"progress\"]" 2>/dev/null'
    kill -KILL "$victim"
    wait "$victim" 2>/dev/null
    start_worker "$lang-rescuer" "$@" --commands "$cmd" --lease-ms 3000 --wait-ms 1000
    wait_job "$job" 20s
    check "$lang: after the lease ran out another worker ran it (attempt 2)" py "assert j['state']=='succeeded' and j['output']['attempt']==2, j"
    req GET "/v1/jobs/$job/events"
    check "$lang: the history has both dispatches and one result" py "e=j['events']; assert [x['data']['attempt'] for x in e if x['kind']=='dispatch']==[1,2] and len([x for x in e if x['kind']=='complete'])==1"
}
kill_mid_task python py.sleep python3 "$PYW"
[ $HAVE_NODE = 1 ] && kill_mid_task node node.sleep node "$NODEW"

req GET /v1/workers
check "GET /v1/workers lists the workers" py "assert len(j['workers'])>=2"

# ---- SIGTERM drains ----
kill -TERM "$PY"
wait "$PY"
check "the Python worker exits 0 on SIGTERM" [ $? = 0 ]
if [ $HAVE_NODE = 1 ]; then
    kill -TERM "$NODE"
    wait "$NODE"
    check "the Node worker exits 0 on SIGTERM" [ $? = 0 ]
fi
for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
wait "${PIDS[@]}" 2>/dev/null
stop_server
finish
