#!/usr/bin/env bash
# Substitution bounds and parse limits against the real server (issue 12,
# items 1, 6 and 10): the chained-splice poison job fails at its step with a
# substitution error while the server stays small and restarts cleanly; the
# submit-time splice attack gets its 422 with a pointer at once; a batch job
# over the definition limit and a far array index are refused with 422;
# messages to a topic no step waits on are capped per job (409).
# Prints TAP.
# shellcheck disable=SC2016,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

start_server || exit 1

rep() { # text count: text repeated count times
    local i out=
    for ((i = 0; i < $2; i++)); do out+=$1; done
    printf '%s' "$out"
}
S=$(rep x 1000)

# ---- the poison job: a makes 60 KB, b asks for 18 MB, c for 54 GB ----
def="{\"steps\":[{\"id\":\"a\",\"call\":\"echo\",\"args\":{\"v\":\"$(rep '${input.s}' 60)\"}},"
def+="{\"id\":\"b\",\"call\":\"echo\",\"args\":{\"v\":\"$(rep '${steps.a.output.v}' 300)\"}},"
def+="{\"id\":\"c\",\"call\":\"echo\",\"args\":{\"v\":\"$(rep '${steps.b.output.v}' 3000)\"}}],"
def+="\"input\":{\"s\":\"$S\"}}"
printf '%s' "$def" >"$WORK/poison"
req POST /v1/jobs -H 'Content-Type: application/json' --data-binary @"$WORK/poison"
check "poison job: accepted (only run time knows b's input)" status_is 201
id=$(location_id)
wait_job "$id"
check "poison job: fails at step b" eval 'body_has "\"state\":\"failed\"" && body_has "\"step\":\"b\""'
check "poison job: kind substitution, naming the string limit" \
    eval 'body_has "\"kind\":\"substitution\"" && body_has "65536-byte string limit"'
hwm_kb=$(awk '/^VmHWM/ {print $2}' "/proc/$SERVER_PID/status")
check "server peak RSS stays under 150 MB (was ${hwm_kb} kB)" test "${hwm_kb:-999999}" -lt 153600
req GET /livez
check "server answers /livez" status_is 200

# ---- the same splice at submit: 100 strings of 60 KB, 422 at once ----
body="{\"handler\":\"echo\",\"input\":{\"s\":\"$S\"},\"args\":{"
one=$(rep '${input.s}' 60)
sep=
for ((i = 0; i < 100; i++)); do
    body+="$sep\"s$i\":\"$one\""
    sep=,
done
body+="}}"
printf '%s' "$body" >"$WORK/splice"
t0=$(date +%s%N)
req POST /v1/jobs -H 'Content-Type: application/json' --data-binary @"$WORK/splice"
ms=$((($(date +%s%N) - t0) / 1000000))
check "submit-time splice past 1 MiB: 422 at /args/s17" \
    eval 'is_problem 422 && body_has "\"pointer\":\"/args/s17\"" && body_has "1048576-byte limit"'
check "submit-time splice: answered in under a second (${ms} ms)" test "$ms" -lt 1000

# ---- a batch job over the definition limit: 422 at /jobs/1 ----
big="\"$(rep y 60000)\""
arr=$big
for ((i = 1; i < 20; i++)); do arr+=",$big"; done
printf '{"jobs":[{"handler":"echo"},{"handler":"echo","input":[%s]}]}' "$arr" >"$WORK/batch"
req POST /v1/jobs/batch -H 'Content-Type: application/json' --data-binary @"$WORK/batch"
check "batch job of 1.2 MB: 422 at /jobs/1" \
    eval 'is_problem 422 && body_has "\"pointer\":\"/jobs/1\"" && body_has "the limit is 1048576"'

# ---- an array index past int does not wrap ----
json_post /v1/jobs '{"handler":"echo","input":{"a":[10,20]},"args":{"v":"${input.a.4294967297}"}}'
check "\${input.a.4294967297} on a 2-element array: 422 at /args/v" \
    eval 'is_problem 422 && body_has "\"pointer\":\"/args/v\"" && body_has "does not resolve"'
json_post /v1/jobs '{"handler":"echo","input":{"a":[10,20]},"args":{"v":"${input.a.1}"}}'
check "\${input.a.1} still resolves" status_is 201

# ---- messages no step waits on: at most 16 MiB (or 1000) per job ----
json_post /v1/jobs '{"steps":[{"id":"w","wait":"go"}]}'
wid=$(location_id)
chunk=$(head -c 64000 /dev/zero | tr '\0' m)
msg="{\"topic\":\"nobody\",\"data\":[\"$chunk\""
for ((i = 1; i < 15; i++)); do msg+=",\"$chunk\""; done
msg+="]}"
printf '%s' "$msg" >"$WORK/msg"
accepted=0
for ((i = 0; i < 20; i++)); do
    req POST "/v1/jobs/$wid/messages" -H 'Content-Type: application/json' --data-binary @"$WORK/msg"
    status_is 202 || break
    accepted=$((accepted + 1))
done
check "17 messages of 960 KB to a topic no step waits on are kept (got $accepted)" \
    test "$accepted" = 17
check "the next one: 409 saying why" \
    eval 'is_problem 409 && body_has "no step waits on" && body_has "16777216 bytes"'
json_post "/v1/jobs/$wid/messages" '{"topic":"go","data":1}'
check "one the job waits for still fits" status_is 202
wait_job "$wid"
check "and the job takes it" body_has '"state":"succeeded"'

# ---- the failed poison job does not come back on restart ----
stop_server
check "server stops cleanly" test "$SERVER_RC" = 0
start_server || exit 1
req GET "/v1/jobs/$id"
check "after restart: the poison job is still failed at b" \
    eval 'status_is 200 && body_has "\"state\":\"failed\"" && body_has "\"step\":\"b\""'
req GET /livez
check "after restart: /livez" status_is 200
stop_server
finish
