#!/usr/bin/env bash
# Two jackdawd nodes on one throwaway PostgreSQL (issue 16 phase 2, the job
# layer's half): a job submitted on A is waited for on B; a cancel on B
# reaches a job running on A; a message on B reaches a workflow waiting on
# A; a schedule fires once per fire time with both nodes up; SIGKILL A:
# after its lease (--lease 2s) B takes its unfinished jobs over and they
# finish, no recorded step run twice (each exec step makes a marker file).
# Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=tests/pg/pg.sh
. tests/pg/pg.sh

pg_test_start
MARK=$WORK/marks
mkdir -p "$MARK"

NODE_FLAGS=(--lease 2s --exec-allow "/usr/bin/mktemp,/bin/sleep") # start_node (lib.sh)

start_node A || exit 1
if ! start_node B; then
    if grep -q "in use by another running Jackdaw" "$WORK/node.B.log"; then
        ok "a second node # SKIP this build's store runs one node per database"
        finish
        exit 0
    fi
    notok "node B starts" "$(tail -n 5 "$WORK/node.B.log")"
    finish
    exit 1
fi
check "two nodes joined (two node rows)" eval '[ "$(sql "SELECT count(*) FROM jd_nodes")" = 2 ]'

# metric NODE NAME: that /metrics value of NODE
metric() {
    on "$1" req GET /metrics
    sed -n "s/^$2{node=\"[0-9]*\"} \([0-9]*\).*/\1/p" <<<"$BODY"
}

# ---- no job-change notices while no node watches another's jobs ----
n0=$(metric B jackdaw_cluster_notices_total)
for i in 1 2 3 4 5; do
    on A json_post "/v1/jobs?wait=10s" '{"handler":"echo","args":{}}'
done
# a schedule change is always announced: once B heard it, it heard A's
# commits before it too (notices come in commit order)
on A req PUT /v1/schedules/probe -H 'Content-Type: application/json' \
    --data-binary '{"cron":"0 0 1 1 *","job":{"handler":"echo","args":{}}}'
for _ in $(seq 1 50); do
    [ "$(metric B jackdaw_cluster_notices_total)" -gt "$n0" ] 2>/dev/null && break
    sleep 0.1
done
sleep 0.3
n1=$(metric B jackdaw_cluster_notices_total)
check "nobody watches: of A's commits B heard the schedule's notice only ($((n1 - n0)))" \
    eval '[ "$((n1 - n0))" = 1 ] && [ "$(sql "SELECT count(*) FROM jd_watchers")" = 0 ] && [ "$(metric A jackdaw_cluster_watching)" = 0 ]'
on A req DELETE /v1/schedules/probe

# ---- a job submitted on A, waited for on B ----
on A json_post /v1/jobs '{"steps":[{"id":"w","wait":"go","timeout_ms":60000}]}'
id=$(location_id)
curl -s -o "$WORK/xwait.body" --max-time 20 "$BASE_B/v1/jobs/$id?wait=15s" &
XW=$!
for _ in $(seq 1 50); do
    [ "$(metric B jackdaw_cluster_watching)" = 1 ] && break
    sleep 0.1
done
check "a wait on B for A's job: B wants job-change notices (jd_watchers row, gauge 1)" \
    eval '[ "$(metric B jackdaw_cluster_watching)" = 1 ] && [ "$(sql "SELECT count(*) FROM jd_watchers")" = 1 ]'
n2=$(metric B jackdaw_cluster_notices_total)
on A json_post "/v1/jobs/$id/messages" '{"topic":"go","data":{"hello":"cluster"}}'
wait "$XW"
check "?wait= on B answers with A's result" \
    eval 'grep -q "\"state\":\"succeeded\"" "$WORK/xwait.body" && grep -q "\"hello\":\"cluster\"" "$WORK/xwait.body"'
check "and B heard A's job changes as notices" eval '[ "$(metric B jackdaw_cluster_notices_total)" -gt "$n2" ]'

# ---- submit-and-wait on B, ended by a message sent on A ----
curl -s -o "$WORK/sw.body" -w '%{http_code}' --max-time 20 -H 'Content-Type: application/json' \
    --data-binary '{"steps":[{"id":"w","wait":"go","timeout_ms":60000}]}' \
    "$BASE_B/v1/jobs?wait=15s" >"$WORK/sw.status" &
SW=$!
swid=
for _ in $(seq 1 100); do
    on A req GET "/v1/jobs?state=waiting&limit=1"
    swid=$(python3 -c 'import json,sys; j=json.loads(sys.argv[1])["jobs"]; print(j[0]["id"] if j else "")' "$BODY" 2>/dev/null)
    [ -n "$swid" ] && break
    sleep 0.1
done
on A json_post "/v1/jobs/$swid/messages" '{"topic":"go","data":{"from":"A"}}'
wait "$SW"
check "POST ?wait= on B answers 201 with the job that a message on A ended" \
    eval '[ "$(cat "$WORK/sw.status")" = 201 ] && grep -q "\"state\":\"succeeded\"" "$WORK/sw.body" && grep -q "\"from\":\"A\"" "$WORK/sw.body"'

# ---- cancel on B of a job running on A ----
on A json_post /v1/jobs '{"handler":"sleep","args":{"ms":30000}}'
long=$(location_id)
for _ in $(seq 1 50); do
    on A req GET "/v1/jobs/$long"
    body_has '"state":"running"' && break
    sleep 0.1
done
on B req POST "/v1/jobs/$long/cancel"
check "cancel on B: 202 once in A's inbox" status_is 202
on B wait_job "$long" 15s
check "the job running on A was cancelled" body_has '"state":"cancelled"'
check "the request left the inbox with A's commit" \
    eval '[ "$(sql "SELECT count(*) FROM job_requests")" = 0 ]'

# ---- message on B to a workflow waiting on A ----
on A json_post /v1/jobs '{"steps":[{"id":"w","wait":"go","timeout_ms":600000}]}'
wf=$(location_id)
sleep 0.3
on B json_post "/v1/jobs/$wf/messages" '{"topic":"go","data":{"from":"B"}}'
check "message on B: 202" status_is 202
on B wait_job "$wf" 15s
check "the workflow on A took B's message" \
    eval 'body_has "\"state\":\"succeeded\"" && body_has "\"from\":\"B\""'
on B req POST "/v1/jobs/$wf/cancel"
check "cancel of a finished job: 409" status_is 409
on B req POST "/v1/jobs/999999999/cancel"
check "cancel of no such job: 404" status_is 404

# ---- a queue paused on A holds on B too ----
on A req POST /v1/queues/pq/pause
check "queue paused on A" status_is 200
sleep 1.5
on B json_post /v1/jobs '{"handler":"echo","args":{},"queue":"pq"}'
held=$(location_id)
sleep 1
on B req GET "/v1/jobs/$held"
check "B does not run a job of the queue A paused" body_has '"state":"queued"'
on A req POST /v1/queues/pq/resume
on B wait_job "$held" 10s
check "resumed on A: B runs it" body_has '"state":"succeeded"'

# ---- queue controls set on A apply on B (per node) ----
on A req PUT /v1/queues/cq -H 'Content-Type: application/json' --data-binary '{"max_running":1}'
check "max_running set on A" status_is 200
sleep 1.5
on B json_post /v1/jobs '{"handler":"sleep","args":{"ms":2000},"queue":"cq"}'
c1=$(location_id)
on B json_post /v1/jobs '{"handler":"sleep","args":{"ms":10},"queue":"cq"}'
c2=$(location_id)
sleep 0.5
on B req GET "/v1/jobs/$c2"
check "B keeps A's max_running 1: the second job waits" body_has '"state":"queued"'
on B wait_job "$c2" 10s
check "then it runs" body_has '"state":"succeeded"'

# ---- a schedule fires once per fire time ----
on A req PUT /v1/schedules/beat -H 'Content-Type: application/json' \
    --data-binary '{"every":"1s","job":{"handler":"echo","args":{"beat":true}}}'
check "schedule created" eval 'status_is 201 || status_is 200'
sleep 4.5
# one snapshot: a fire's job and its event commit together
same=$(sql "SELECT (SELECT count(*) FROM jobs WHERE idempotency_key LIKE 'schedule:beat:%') = (SELECT count(*) FROM schedule_events WHERE schedule_id = 'beat' AND kind IN ('fired', 'caught_up'))")
fired=$(sql "SELECT count(*) FROM jobs WHERE idempotency_key LIKE 'schedule:beat:%'")
dup=$(sql "SELECT count(*) - count(DISTINCT fire_ms) FROM schedule_events WHERE schedule_id = 'beat' AND kind IN ('fired', 'caught_up')")
on B req DELETE /v1/schedules/beat
check "deleted on B" status_is 204
check "the schedule fired ($fired jobs) with two nodes up" eval '[ "$fired" -ge 2 ]'
check "one fire event per job, no fire time twice" eval '[ "$same" = t ] && [ "$dup" = 0 ]'

# ---- SIGKILL A: B takes over ----
ids=()
for i in 1 2 3 4 5; do
    on A json_post /v1/jobs "{\"steps\":[{\"id\":\"a\",\"call\":\"exec\",\"args\":{\"argv\":[\"/usr/bin/mktemp\",\"$MARK/j$i-a.XXXXXX\"]}},{\"id\":\"s\",\"call\":\"sleep\",\"args\":{\"ms\":2500}},{\"id\":\"b\",\"call\":\"exec\",\"args\":{\"argv\":[\"/usr/bin/mktemp\",\"$MARK/j$i-b.XXXXXX\"]}}]}"
    ids+=("$(location_id)")
done
for _ in $(seq 1 50); do
    [ "$(find "$MARK" -name 'j*-a.*' | wc -l)" -ge 5 ] && break
    sleep 0.1
done
sleep 0.2
{
    kill -KILL "$PID_A"
    wait "$PID_A"
} 2>/dev/null
left=0
for j in "${ids[@]}"; do
    on B wait_job "$j" 20s
    body_has '"state":"succeeded"' || left=$((left + 1))
done
check "B finished all 5 of A's jobs after A's lease ran out" eval '[ "$left" = 0 ]'
dups=0
for i in 1 2 3 4 5; do
    for s in a b; do
        [ "$(find "$MARK" -name "j$i-$s.*" | wc -l)" = 1 ] || dups=$((dups + 1))
    done
done
check "each step ran exactly once (one marker per step)" eval '[ "$dups" = 0 ]'
check "A's node row is gone" eval '[ "$(sql "SELECT count(*) FROM jd_nodes")" = 1 ]'

# ---- SIGSTOP C past its lease: B takes over, C comes back fenced ----
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start_node C "$port" || exit 1
on C json_post /v1/jobs "{\"steps\":[{\"id\":\"s\",\"call\":\"sleep\",\"args\":{\"ms\":1500}},{\"id\":\"c\",\"call\":\"exec\",\"args\":{\"argv\":[\"/usr/bin/mktemp\",\"$MARK/stop-c.XXXXXX\"]}}]}"
stopped=$(location_id)
on C json_post /v1/jobs '{"handler":"exec","args":{"argv":["/bin/sleep","30"]}}'
child_job=$(location_id)
sleep 0.5
kill -STOP "$PID_C"
on B wait_job "$stopped" 20s
check "B finished the job of the stopped node" body_has '"state":"succeeded"'
kill -CONT "$PID_C"
back=0
for _ in $(seq 1 100); do
    if [ "$(grep -c '"msg":"ready"' "$WORK/node.C.log")" -ge 2 ] &&
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE_C/readyz")" = 200 ]; then
        back=1
        break
    fi
    sleep 0.1
done
check "the stopped node found its lease lost and started over on its port" \
    eval '[ "$back" = 1 ] && grep -q "lost its lease" "$WORK/node.C.log"'
sleep 1
check "its exec child was killed when it started over" \
    eval '! pgrep -P "$PID_C" -f "sleep 30" >/dev/null'
on C req POST "/v1/jobs/$child_job/cancel"
on B wait_job "$child_job" 15s
check "that job (B's now) cancelled from C" body_has '"state":"cancelled"'
check "its step after the sleep ran once (B's), none from the fenced node" \
    eval '[ "$(find "$MARK" -name "stop-c.*" | wc -l)" = 1 ]'
check "the job ended once: one final state event" \
    eval '[ "$(sql "SELECT count(*) FROM events_all WHERE job_id = $stopped AND kind = 0 AND data LIKE '"'"'%succeeded%'"'"'")" = 1 ]'
on B req GET /metrics
check "/metrics: B's claims and takeovers" \
    eval 'body_has "jackdaw_cluster_claims_total{node=" && body_has "jackdaw_cluster_takeovers_total{node="'
kill -TERM "$PID_B" "$PID_C"
wait "$PID_B"
rc_b=$?
wait "$PID_C"
rc_c=$?
check "both nodes stop cleanly on SIGTERM (exit $rc_b, $rc_c)" eval '[ "$rc_b" = 0 ] && [ "$rc_c" = 0 ]'
check "a clean stop removes the node rows" eval '[ "$(sql "SELECT count(*) FROM jd_nodes")" = 0 ]'
NODES=()
finish
