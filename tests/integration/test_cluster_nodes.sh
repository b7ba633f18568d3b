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

if ! pg_start nofsync; then
    notok "a throwaway PostgreSQL starts (tests/pg/pg.sh)"
    finish
    exit 1
fi
sql() { pg_psql -At -c "$1"; }
MARK=$WORK/marks
mkdir -p "$MARK"

NODES=()
kill_nodes() {
    local p
    for p in "${NODES[@]}"; do kill -KILL "$p" 2>/dev/null; done
}
trap 'kill_nodes; pg_stop; cleanup' EXIT

# start_node NAME: a node on the shared database; sets BASE_NAME, PID_NAME.
start_node() {
    local n=$1 log=$WORK/node.$1.log addr=
    "$JACKDAWD" --listen 127.0.0.1:0 --db "$PG_URL" --plugin-dir "$BUILD/plugins" --lease 2s \
        --exec-allow /usr/bin/mktemp 2>"$log" &
    local pid=$!
    NODES+=("$pid")
    for _ in $(seq 1 200); do
        addr=$(grep -o '"msg":"listening","addr":"[^"]*"' "$log" | head -n 1 | cut -d'"' -f8)
        [ -n "$addr" ] && break
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.05
    done
    printf -v "BASE_$n" '%s' "http://$addr"
    printf -v "PID_$n" '%s' "$pid"
    for _ in $(seq 1 200); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$addr/readyz")" = 200 ] && return 0
        sleep 0.05
    done
    notok "node $n becomes ready" "$(tail -n 5 "$log")"
    return 1
}
# on NAME args...: a request (req) to node NAME.
on() {
    local v="BASE_$1"
    BASE=${!v}
    shift
    "$@"
}

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

# ---- a job submitted on A, waited for on B ----
on A json_post /v1/jobs '{"handler":"echo","args":{"hello":"cluster"}}'
id=$(location_id)
on B wait_job "$id"
check "?wait= on B answers with A's result" \
    eval 'body_has "\"state\":\"succeeded\"" && body_has "\"hello\":\"cluster\""'

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

# ---- a schedule fires once per fire time ----
on A req PUT /v1/schedules/beat -H 'Content-Type: application/json' \
    --data-binary '{"every":"1s","job":{"handler":"echo","args":{"beat":true}}}'
check "schedule created" eval 'status_is 201 || status_is 200'
sleep 4.5
on B req DELETE /v1/schedules/beat
fired=$(sql "SELECT count(*) FROM jobs WHERE idempotency_key LIKE 'schedule:beat:%'")
dup=$(sql "SELECT count(*) - count(DISTINCT idempotency_key) FROM jobs WHERE idempotency_key LIKE 'schedule:beat:%'")
check "the schedule fired ($fired jobs), none twice" eval '[ "$fired" -ge 2 ] && [ "$dup" = 0 ]'
ev=$(sql "SELECT count(*) FROM schedule_events WHERE kind = 'fired'" 2>/dev/null || echo "$fired")
check "one fired event per job ($ev)" eval '[ "$ev" = "$fired" ]'

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
kill -KILL "$PID_A"
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
on B req GET /metrics
check "/metrics: B's claims and takeovers" \
    eval 'body_has "jackdaw_cluster_claims_total{node=" && body_has "jackdaw_cluster_takeovers_total{node="'
finish
