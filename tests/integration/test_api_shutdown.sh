#!/usr/bin/env bash
# Graceful shutdown: on SIGTERM a parked long-poll is answered at once,
# a connection already open sees /readyz 503 while the server drains, new
# connections are refused, the process exits 0, and a workflow that was in
# flight resumes on the next start without re-running its recorded step.
# SIGINT behaves the same; a second signal during the drain exits at once.
# Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

FX=$WORK/effects
start_server --exec-allow /bin/sh,/bin/sleep --grace 5s || exit 1

# step one records a side effect, step two sleeps long enough to be in
# flight at SIGTERM, step three records another side effect
json_post /v1/jobs "{\"steps\":[
  {\"id\":\"one\",\"call\":\"exec\",\"args\":{\"argv\":[\"/bin/sh\",\"-c\",\"echo one >>$FX\"]}},
  {\"id\":\"nap\",\"sleep_ms\":1500},
  {\"id\":\"three\",\"call\":\"exec\",\"args\":{\"argv\":[\"/bin/sh\",\"-c\",\"echo three >>$FX\"]}}]}"
check "workflow accepted" status_is 201
WF=$(location_id)
for _ in $(seq 1 100); do grep -q one "$FX" 2>/dev/null && break; sleep 0.05; done
check "step one ran before the shutdown" grep -q one "$FX"

# a job whose blocking step keeps the drain busy for a moment
json_post /v1/jobs '{"handler":"exec","args":{"argv":["/bin/sleep","1"]}}'
BUSY=$(location_id)
sleep 0.2

# a parked long-poll, and a keep-alive connection opened before the signal
curl -s --max-time 20 "$BASE/v1/jobs/$WF?wait=30s" >"$WORK/lp.out" &
LP=$!
PORT=${BASE##*:}
exec 3<>"/dev/tcp/127.0.0.1/$PORT"
printf 'GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n' >&3
IFS= read -r -t 5 first <&3
while IFS= read -r -t 5 line <&3; do [ "${line%$'\r'}" = "" ] && break; done
head -c 19 <&3 >/dev/null # {"status":"ready"}\n
check "keep-alive connection: /readyz 200 before the signal" eval '[[ "$first" == *" 200 "* ]]'
sleep 0.3

t0=$(date +%s%N)
kill -TERM "$SERVER_PID"
sleep 0.1
printf 'GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n' >&3
IFS= read -r -t 5 second <&3
exec 3<&-
check "while draining, /readyz on an open connection: 503 ($second)" eval '[[ "$second" == *" 503 "* ]]'
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$BASE/livez")
check "while draining, new connections are refused" [ "$code" = 000 ]
wait "$LP"
lp_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
check "parked long-poll answered with the job's state at shutdown (${lp_ms} ms)" \
    eval 'grep -q "\"id\":\"$WF\"" "$WORK/lp.out" && [ "$lp_ms" -lt 3000 ]'
stop_server wait
stop_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
check "SIGTERM: exit 0 (${stop_ms} ms)" eval '[ "$SERVER_RC" = 0 ] && [ "$stop_ms" -lt 8000 ]'
check "log says shutting down and stopped" eval 'grep -q "\"msg\":\"shutting down\"" "$LOG" && grep -q "\"msg\":\"stopped\"" "$LOG"'

start_server --exec-allow /bin/sh,/bin/sleep || exit 1
wait_job "$WF" 20s
check "the in-flight workflow resumes and succeeds after restart" body_has '"state":"succeeded"'
check "its recorded step did not run again" eval '[ "$(grep -c one "$FX")" = 1 ] && [ "$(grep -c three "$FX")" = 1 ]'
wait_job "$BUSY" 20s
check "the job running at shutdown finishes too" body_has '"state":"succeeded"'
stop_server INT
check "SIGINT: exit 0" [ "$SERVER_RC" = 0 ]

# A second signal during the drain ends the process at once.
start_server --exec-allow /bin/sleep --grace 30s || exit 1
json_post /v1/jobs '{"handler":"exec","args":{"argv":["/bin/sleep","2"]}}'
LONGJ=$(location_id)
sleep 0.3
t0=$(date +%s%N)
kill -TERM "$SERVER_PID"
sleep 0.3
stop_server TERM
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
check "second SIGTERM during the drain exits at once (${ms} ms)" \
    eval '[ "$SERVER_RC" = 143 ] && [ "$ms" -lt 3000 ]'
start_server --exec-allow /bin/sleep || exit 1
wait_job "$LONGJ" 20s
check "the job interrupted that way still finishes after restart" body_has '"state":"succeeded"'
stop_server
finish
