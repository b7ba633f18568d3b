#!/usr/bin/env bash
# The example workers (examples/workers/python/worker.py, standard library
# only, and examples/workers/node/worker.mjs, Node's fetch) against a real
# server: they register their commands, jobs that call them succeed (one
# workflow uses both), failures reach the job (retryable ones retried),
# progress shows on the job, a traced job's traceparent reaches the
# handler, a worker SIGKILLed mid-task has its task
# offered again after the lease (attempt 2, served by another worker), a
# server SIGKILLed while workers hold tasks and restarted on the same
# database loses nothing and re-runs no recorded result (the workers ride
# out the restart), SIGTERM drains a worker to exit 0, and against a fake
# server answering 503 they retry a report (Retry-After) while the lease lasts.
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

# ---- the server SIGKILLed while workers hold tasks ----
# Effect workers append "<idempotency key> <attempt> <lang>" to $EFFECTS
# once per attempt. After the kill and a restart on the same port and
# database, every job must succeed with each step's result recorded once,
# and the effects file may repeat a key only for attempts before the
# recorded one (attempts the server had handed out but not recorded).
EFFECTS=$WORK/effects
: >"$EFFECTS"
EFF_CMDS=py.effect
EFFECTS_LOG=$EFFECTS start_worker py-effects python3 "$PYW" --commands py.effect --concurrency 4 --wait-ms 1000
EFF_PIDS=("$LAST")
until_ok 10 registered py.effect
if [ $HAVE_NODE = 1 ]; then
    EFF_CMDS=node.effect
    EFFECTS_LOG=$EFFECTS start_worker node-effects node "$NODEW" --commands node.effect --concurrency 4 --wait-ms 1000
    EFF_PIDS+=("$LAST")
    until_ok 10 registered node.effect
fi
# a shell worker through `jackdaw work`: the key and attempt come in its
# environment
cat >"$WORK/effect.sh" <<'SH'
#!/bin/sh
cat >/dev/null
echo "$JACKDAW_IDEMPOTENCY_KEY $JACKDAW_ATTEMPT sh" >>"$EFFECTS_LOG"
sleep 1
echo "{\"attempt\": $JACKDAW_ATTEMPT, \"by\": \"sh\"}"
SH
chmod +x "$WORK/effect.sh"
req PUT /v1/commands/sh.effect -H "$J" -d '{}'
EFFECTS_LOG=$EFFECTS start_worker sh-effects "$BUILD/jackdaw" work --command sh.effect --concurrency 2 -- "$WORK/effect.sh"
EFF_PIDS+=("$LAST")
# One batch (one commit), so the workers are busy when the server is killed.
CRASH=$(python3 -c '
import json, sys
eff = sys.argv[1]
jobs = [{"handler": "sh.effect"} for _ in range(4)]
for _ in range(8):
    jobs += [{"handler": "py.effect", "args": {"seconds": 1}},
             {"handler": eff, "args": {"seconds": 1}}]
for _ in range(6):
    jobs.append({"steps": [{"id": "a", "call": "py.effect", "args": {"seconds": 0.3}},
                           {"id": "b", "call": eff, "args": {"seconds": 0.3}},
                           {"id": "c", "call": "sh.effect"},
                           {"id": "d", "call": "py.effect", "args": {"seconds": 0.3}}]})
print(json.dumps({"jobs": jobs}))' "$EFF_CMDS")
req POST /v1/jobs/batch -H "$J" --data-binary "$CRASH"
check "a batch of 26 jobs using the workers is accepted" status_is 201
mapfile -t CRASH_JOBS < <(py "print('\\n'.join(x['id'] for x in j['jobs']))")
held() { req GET /v1/commands/py.effect && py "assert j['in_flight']>=4" 2>/dev/null; }
check "workers hold tasks" until_ok 10 held
PORT=${BASE##*:}
stop_server KILL
sleep 0.5 # the server is away for a moment
start_server --listen "127.0.0.1:$PORT" || exit 1
check "the server comes back on the same port" [ "$BASE" = "http://127.0.0.1:$PORT" ]
# crash_audit: one line per job, from its record and its history, checked
# against the effects file
crash_audit() {
    local id
    for id in "${CRASH_JOBS[@]}"; do
        wait_job "$id" 30s
        printf '%s\n' "$BODY"
        req GET "/v1/jobs/$id/events"
        printf '%s\n' "$BODY"
    done >"$WORK/crash.json"
    python3 - "$WORK/crash.json" "$EFFECTS" <<'PY'
import collections, json, sys
lines = open(sys.argv[1]).read().splitlines()
effects = collections.Counter(tuple(l.split()[:2]) for l in open(sys.argv[2]) if l.strip())
bad, reran, recorded = [], 0, set()
for job, ev in zip(lines[0::2], lines[1::2]):
    job, ev = json.loads(job), json.loads(ev)["events"]
    if job["state"] != "succeeded":
        bad.append("job %s is %s" % (job["id"], job["state"]))
    steps = len(job["definition"].get("steps", [None]))
    done = collections.Counter(e["tag"] for e in ev if e["kind"] == "complete")
    if len(done) != steps or any(n != 1 for n in done.values()):
        bad.append("job %s: results per step %s" % (job["id"], dict(done)))
    for e in ev:
        if e["kind"] != "complete":
            continue
        key, att = "%s:%d" % (job["id"], e["tag"]), e["data"]["result"]["attempt"]
        recorded.add(key)
        reran += att > 1
        disp = [d["data"]["attempt"] for d in ev if d["kind"] == "dispatch" and d["tag"] == e["tag"]]
        # a task still waiting at the kill waits again as the same attempt
        # (a second dispatch event); a claimed one comes back as attempt + 1
        if disp != sorted(disp) or sorted(set(disp)) != list(range(1, att + 1)):
            bad.append("%s: dispatches %s, recorded attempt %d" % (key, disp, att))
        if effects[(key, str(att))] != 1:
            bad.append("%s: the recorded attempt %d ran %d times" % (key, att, effects[(key, str(att))]))
        later = [a for (k, a) in effects if k == key and int(a) > att]
        if later:
            bad.append("%s: ran again (attempts %s) after attempt %d was recorded" % (key, later, att))
dup = [k for k, n in effects.items() if n > 1]
stray = sorted({k for k, _ in effects} - recorded)
if dup or stray:
    bad.append("attempts run twice %s, keys with no result %s" % (dup, stray))
if reran == 0:
    bad.append("no step was offered again: the kill hit no held task")
for b in bad:
    print("#", b)
print("# %d jobs, %d effect lines, %d steps offered again after the restart"
      % (len(lines) // 2, sum(effects.values()), reran))
sys.exit(1 if bad else 0)
PY
}
check "after the restart every job succeeds, each result recorded once, none re-run" crash_audit

req GET /v1/workers
check "GET /v1/workers lists the workers" py "assert len(j['workers'])>=2"

# ---- SIGTERM drains (all at once: an idle slot takes up to its wait) ----
kill -TERM "$PY" "${EFF_PIDS[@]}"
[ $HAVE_NODE = 1 ] && kill -TERM "$NODE"
wait "$PY"
check "the Python worker exits 0 on SIGTERM" [ $? = 0 ]
if [ $HAVE_NODE = 1 ]; then
    wait "$NODE"
    check "the Node worker exits 0 on SIGTERM" [ $? = 0 ]
fi
for p in "${EFF_PIDS[@]}"; do
    wait "$p"
    check "an effect worker that rode out the restart exits 0 on SIGTERM" [ $? = 0 ]
done
for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
wait "${PIDS[@]}" 2>/dev/null
# ---- retries against a node that answers 503 (a cluster's stalled owner) ----
# fake_tasks.py: t1's complete answers 503 (Retry-After: 1) three times,
# t2's 409, t3's (for a worker with a 2 s lease) always 503.
# fake_run NAME COMMAND WORKER...: both workers against a fake of their own
fake_run() {
    local n=$1 c=$2 f p
    shift 2
    python3 tests/integration/fake_tasks.py "$WORK/$n.port" "$WORK/$n.fake" "$c" '{"text":"ab"}' '{"text":"ab"}' &
    f=$!
    until_ok 10 test -s "$WORK/$n.port"
    local u
    u=http://127.0.0.1:$(cat "$WORK/$n.port")
    "$@" --url "$u" --commands "$c" --concurrency 1 --lease-ms 12000 2>"$WORK/$n.w12" &
    local a=$!
    "$@" --url "$u" --commands "$c" --concurrency 1 --lease-ms 2000 2>"$WORK/$n.w2" &
    local b=$!
    until_ok 40 grep -q "could not report task t3" "$WORK/$n.w2"
    until_ok 40 grep -q "t2/complete" "$WORK/$n.fake"
    sleep 1 # room for a wrong retry of the 409
    kill -TERM "$a" "$b"
    wait "$a" "$b"
    kill "$f" 2>/dev/null
    wait "$f" 2>/dev/null
    p=$WORK/$n.fake
    check "$n: a complete answered 503 three times is delivered on the fourth try" \
        eval '[ "$(grep -c "^/v1/tasks/t1/complete 503" "$p")" = 3 ] && grep -q "^/v1/tasks/t1/complete 200" "$p"'
    check "$n: a 409 on complete is final (one try)" eval '[ "$(grep -c "^/v1/tasks/t2/complete" "$p")" = 1 ]'
    local n3
    n3=$(grep -c "^/v1/tasks/t3/complete 503" "$p")
    check "$n: still 503 when the lease runs out: retried, then given up and logged" \
        eval '[ "$n3" -ge 2 ] && [ "$n3" -le 6 ] && grep -q "could not report task t3" "$WORK/$n.w2"'
}
fake_run python py.upper python3 "$PYW"
[ $HAVE_NODE = 1 ] && fake_run node node.reverse node "$NODEW"

stop_server
finish
