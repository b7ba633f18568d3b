#!/usr/bin/env bash
# The jackdaw CLI against the real server: every subcommand, its --json
# output (parsed with python3), its exit codes and --help, and the generic
# worker (`jackdaw work`) serving a remote command.
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

JDC=$BUILD/jackdaw
if [ ! -x "$JDC" ]; then
    echo "not ok 1 - $JDC is built (run make first)"
    exit 1
fi
# --max-wait 1s: a --wait longer than one server wait must go on waiting
start_server --max-wait 1s || { finish; exit 1; }
export JACKDAW_URL=$BASE
unset JACKDAW_TOKEN
OUT=$WORK/out
ERR=$WORK/err
# run ARGS...: runs the CLI, output in $OUT/$ERR, exit status in RC
run() {
    "$JDC" "$@" >"$OUT" 2>"$ERR"
    RC=$?
}
rc_is() { [ "$RC" = "$1" ]; }
out_has() { grep -qF -- "$1" "$OUT"; }
err_has() { grep -qF -- "$1" "$ERR"; }
# py EXPR: evaluates EXPR with j = the JSON in $OUT; true when truthy
py() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if ($1) else 1)" "$OUT"; }

# --help for the tool and every subcommand: exit 0, usage on stdout
run --help
check "--help exits 0 and documents exit codes" eval 'rc_is 0 && out_has "Exit codes" && out_has "JACKDAW_URL"'
for c in submit get events cancel retry ls queues pause resume message handlers schedules; do
    run "$c" --help
    check "$c --help exits 0 with its usage" eval "rc_is 0 && out_has 'usage: jackdaw $c'"
done
run
check "no command: usage, exit 2" eval 'rc_is 2 && err_has usage'
run frobnicate
check "unknown command: exit 2" eval 'rc_is 2 && err_has "unknown command"'
run get
check "get without an id: exit 2" rc_is 2
run get 1 --wait soon
check "a bad duration: exit 2" eval 'rc_is 2 && err_has "bad duration"'

# submit from a file and from stdin; get; wait
echo '{"handler":"echo","args":{"n":7}}' >"$WORK/job.json"
run submit "$WORK/job.json"
ID=$(cat "$OUT")
check "submit FILE prints the id" eval 'rc_is 0 && [[ "$ID" =~ ^[0-9]+$ ]]'
run get "$ID" --wait 10s
check "get --wait prints the finished job" eval 'rc_is 0 && out_has succeeded && out_has "{\"n\":7}"'
run --json get "$ID"
check "get --json is the server's job" py "j['id'] == '$ID' and j['output'] == {'n': 7}"
"$JDC" submit - <"$WORK/job.json" >"$OUT" 2>"$ERR"
RC=$?
check "submit - reads stdin" eval 'rc_is 0 && grep -qE "^[0-9]+$" "$OUT"'
run submit "$WORK/job.json" --wait 10s --json
check "submit --wait --json prints the finished job" py "j['state'] == 'succeeded'"
echo '{"handler":"fail","args":{}}' >"$WORK/fail.json"
run submit "$WORK/fail.json" --wait 10s
check "submit --wait: a failed job exits 4" eval 'rc_is 4 && out_has failed'
FAILED_ID=$(awk '$1 == "id" {print $2}' "$OUT")
echo '{"handler":"sleep","args":{"ms":600000}}' >"$WORK/sleep.json"
run submit "$WORK/sleep.json"
SL=$(cat "$OUT")
run get "$SL" --wait 200ms
check "get --wait: a job still running when the wait ends exits 5" rc_is 5
run submit "$WORK/sleep.json" --wait 300ms --json
check "submit --wait: a job still running when the wait ends exits 5, printed" \
    eval 'rc_is 5 && py "j[\"state\"] in (\"queued\", \"running\") and j[\"id\"]"'
echo '{"handler":"sleep","args":{"ms":2500}}' >"$WORK/sleep2.json"
run submit "$WORK/sleep2.json" --wait 10s
check "submit --wait outlasts the server's --max-wait 1s: the job's end, exit 0" \
    eval 'rc_is 0 && out_has succeeded'

# bad input and server refusals
echo '{"handler":' >"$WORK/bad.json"
run submit "$WORK/bad.json"
check "submit of bad JSON: exit 1, the problem on stderr" eval 'rc_is 1 && err_has 400'
run get 999999
check "get of an unknown id: exit 1 with the detail" eval 'rc_is 1 && err_has 404'
run submit "$WORK/missing.json"
check "submit of a missing file: exit 2" rc_is 2
run --url http://127.0.0.1:1 queues
check "cannot connect: exit 3" eval 'rc_is 3 && err_has "cannot reach"'

# events, as JSON and followed live (the stream ends with the job)
run events "$ID"
check "events lists the history" eval 'rc_is 0 && out_has complete && out_has dispatch'
run --json events "$ID"
check "events --json is the server's history" py "len(j) >= 3 if isinstance(j, list) else len(j['events']) >= 3"
run events "$ID" --follow
check "events --follow ends when the job has ended" eval 'rc_is 0 && out_has succeeded'

# message to a waiting workflow, then its result
cat >"$WORK/wf.json" <<'JSON'
{"steps": [{"id": "ok", "wait": "approval", "timeout_ms": 600000}]}
JSON
run submit "$WORK/wf.json"
WF=$(cat "$OUT")
run message "$WF" approval '{"by":"ann"}'
check "message is accepted" rc_is 0
run get "$WF" --wait 10s --json
check "the workflow got the message" py "j['state'] == 'succeeded' and j['output']['ok'] == {'by': 'ann'}"
run message "$WF" approval 'not json'
check "message with bad JSON: exit 2" rc_is 2

# cancel and retry
run cancel "$SL"
check "cancel exits 0" rc_is 0
run get "$SL" --wait 10s
check "the cancelled job: get --wait exits 4" eval 'rc_is 4 && out_has cancelled'
run retry "$FAILED_ID"
check "retry of a failed job exits 0" rc_is 0
run retry 999999
check "retry of an unknown job: exit 1" rc_is 1

# ls with filters and pagination
run ls --limit 2
check "ls prints a header and two jobs" eval 'rc_is 0 && [ "$(wc -l <"$OUT")" = 3 ] && out_has "STATE" && err_has -- "--cursor"'
CUR=$(sed -n 's/^more: --cursor //p' "$ERR")
# the older of the first page's two jobs (newest first)
LAST1=$(awk 'NR == 3 {print $1}' "$OUT")
run --json ls --limit 2 --cursor "$CUR"
check "ls --cursor gives the next page" py "len(j['jobs']) == 2 and all(int(x['id']) < int('$LAST1') for x in j['jobs'])"
run --json ls --state cancelled
check "ls --state filters" py "len(j['jobs']) == 1 and j['jobs'][0]['id'] == '$SL'"
run ls --state nonsense
check "ls with a bad state: exit 1" rc_is 1

# queues, pause, resume
run pause default
check "pause exits 0" rc_is 0
run --json queues
check "queues --json shows the pause" py "[q for q in j['queues'] if q['name'] == 'default'][0]['paused'] is True"
run queues
check "queues prints a table" eval 'out_has PAUSED && grep -qE "^default\s+yes" "$OUT"'
run resume default
run --json queues
check "resume un-pauses" py "[q for q in j['queues'] if q['name'] == 'default'][0]['paused'] is False"

# handlers
run handlers
check "handlers lists the plugins and commands" eval 'rc_is 0 && grep -qE "^echo\s" "$OUT"'
run --json handlers
check "handlers --json is the server's answer" py "any(p['name'] == 'echo' for p in j['plugins'])"

# schedules: put (id on the command line or in the file), ls, get, trigger,
# pause, resume, events, rm, and a bad expression
echo '{"id":"nightly","cron":"0 3 * * *","timezone":"Europe/Berlin","job":{"handler":"echo","args":{"r":1}}}' >"$WORK/s.json"
run schedules put "$WORK/s.json"
check "schedules put FILE takes the id from the file" eval 'rc_is 0 && out_has "cron 0 3 * * *" && grep -qE "^next_fire\s+2" "$OUT"'
echo '{"every":"1h","job":{"handler":"echo"}}' >"$WORK/s2.json"
"$JDC" schedules put hourly - <"$WORK/s2.json" >"$OUT" 2>"$ERR"
RC=$?
check "schedules put ID - reads stdin" eval 'rc_is 0 && out_has "every 1h"'
run schedules ls
check "schedules ls prints both, one row each" eval 'rc_is 0 && [ "$(wc -l <"$OUT")" = 3 ] && grep -qE "^nightly\s+active\s+cron 0 3 \* \* \*\s+Europe/Berlin" "$OUT"'
run --json schedules ls --limit 1
check "schedules ls --json pages" py "len(j['schedules']) == 1 and j['next_cursor']"
run schedules trigger nightly
TJ=$(cat "$OUT")
check "schedules trigger prints the new job's id" eval 'rc_is 0 && [[ "$TJ" =~ ^[0-9]+$ ]]'
run --json get "$TJ" --wait 10s
check "the triggered job ran the schedule's job" py "j['state'] == 'succeeded' and j['output'] == {'r': 1} and j['labels']['schedule'] == 'nightly'"
run schedules pause nightly
check "schedules pause shows it paused" eval 'rc_is 0 && grep -qE "^state\s+paused" "$OUT"'
run --json schedules resume nightly
check "schedules resume --json: active again, with next fires" py "j['state'] == 'active' and len(j['next_fire_times']) == 5"
run schedules events nightly
check "schedules events: created, triggered, paused, resumed" eval 'rc_is 0 && out_has created && out_has triggered && out_has paused && out_has resumed'
run schedules rm hourly
check "schedules rm exits 0" rc_is 0
run schedules get hourly
check "schedules get of a deleted one: exit 1, 404 on stderr" eval 'rc_is 1 && err_has 404'
echo '{"cron":"0 25 * * *","job":{"handler":"echo"}}' >"$WORK/bad.json"
run schedules put typo "$WORK/bad.json"
check "schedules put with a bad hour: exit 1, the field and the pointer" eval 'rc_is 1 && err_has hour && err_has /cron'
echo '{"every":"1h","job":{"handler":"echo"}}' >"$WORK/noid.json"
run schedules put "$WORK/noid.json"
check "schedules put without an id anywhere: exit 2" eval 'rc_is 2 && err_has "no schedule id"'
run schedules frob x
check "schedules with an unknown subcommand: exit 2" rc_is 2

# the generic worker against the task routes
run work --help
check "work --help exits 0" eval 'rc_is 0 && out_has "usage: jackdaw work"'
req PUT /v1/commands/clitest -H 'Content-Type: application/json' -d '{}'
check "a remote command registers" eval '[ "${STATUS:0:1}" = 2 ]'
cat >"$WORK/prog.sh" <<'SH'
#!/bin/sh
in=$(cat)
case "$in" in
*temp*) echo "try later" >&2; exit 75 ;;
*bad*) echo "no such thing" >&2; exit 3 ;;
*text*) echo plain words ;;
*trace*) echo "\"${TRACEPARENT:-none}\"" ;;
*) echo "$in" ;;
esac
SH
chmod +x "$WORK/prog.sh"
# The worker's own TRACEPARENT never reaches a program: only a task's does.
TRACEPARENT=00-99999999999999999999999999999999-9999999999999999-01 \
    "$JDC" work --command clitest --concurrency 2 --lease 3s -- "$WORK/prog.sh" 2>"$WORK/work.err" &
WPID=$!
for a in '{"n":1}' '{"text":1}' '{"bad":1}'; do
    echo "{\"handler\":\"clitest\",\"args\":$a}" >"$WORK/t.json"
    run submit "$WORK/t.json" --wait 20s --json
    cp "$OUT" "$WORK/res.$a"
done
OUT="$WORK/res.{\"n\":1}"
check "work: stdout JSON is the result" py "j['state'] == 'succeeded' and j['output'] == {'n': 1}"
OUT="$WORK/res.{\"text\":1}"
check "work: text stdout is wrapped as a string" py "j['output'] == 'plain words'"
OUT="$WORK/res.{\"bad\":1}"
check "work: a non-zero exit fails with the stderr tail" py "j['state'] == 'failed' and 'no such thing' in json.dumps(j['error'])"
TP=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
echo '{"handler":"clitest","args":{"trace":1}}' >"$WORK/t.json"
run submit "$WORK/t.json" --traceparent "$TP" --wait 20s --json
check "submit --traceparent: stored on the job; work gives it to the program as TRACEPARENT" \
    py "j['definition']['traceparent'] == '$TP' and j['output'] == '$TP'"
run submit "$WORK/t.json" --wait 20s --json
check "work: a task without a traceparent runs without TRACEPARENT" \
    py "j['state'] == 'succeeded' and 'traceparent' not in j['definition'] and j['output'] == 'none'"
run submit "$WORK/t.json" --traceparent nope
check "submit --traceparent with a malformed one: exit 1, 422 at /traceparent" \
    eval 'rc_is 1 && err_has /traceparent'
OUT=$WORK/out
kill -TERM "$WPID"
wait "$WPID"
check "work drains and exits 0 on SIGTERM" [ $? = 0 ]

# The worker's retries, against a fake server that answers 503 (as a cluster
# node does while the task's owner does not answer): a heartbeat and a
# complete are retried (Retry-After honoured) until one is answered, within
# the lease; a 409 is final; a report still refused when the lease runs out
# is given up (logged), and the worker goes on claiming.
cat >"$WORK/prog2.sh" <<'SH'
#!/bin/sh
in=$(cat)
case "$in" in *slow*) sleep 7 ;; esac
echo "$in"
SH
chmod +x "$WORK/prog2.sh"
python3 tests/integration/fake_tasks.py "$WORK/fake.port" "$WORK/fake.log" fake '{"slow":1}' '{"n":2}' &
FPID=$!
for _ in $(seq 50); do [ -s "$WORK/fake.port" ] && break; sleep 0.1; done
FURL=http://127.0.0.1:$(cat "$WORK/fake.port")
# A 12 s lease: a heartbeat every 4 s, so only a retried one is answered
# before the 7 s program ends.
JACKDAW_URL=$FURL "$JDC" work --command fake --lease 12s -- "$WORK/prog2.sh" 2>"$WORK/work2.err" &
WPID=$!
for _ in $(seq 300); do grep -q "t2/complete" "$WORK/fake.log" 2>/dev/null && break; sleep 0.1; done
sleep 1 # room for a wrong retry of the 409
kill -TERM "$WPID"
wait "$WPID"
WRC=$?
check "work: a heartbeat answered 503 is retried (Retry-After) and answered within the lease" \
    eval 'grep -q "^/v1/tasks/t1/heartbeat 200" "$WORK/fake.log"'
check "work: a complete answered 503 three times is delivered on the fourth try" \
    eval '[ "$(grep -c "^/v1/tasks/t1/complete 503" "$WORK/fake.log")" = 3 ] &&
          grep -q "^/v1/tasks/t1/complete 200 {\"result\":{\"slow\":1}}" "$WORK/fake.log"'
check "work: a 409 on complete is final (one try, logged)" \
    eval '[ "$(grep -c "^/v1/tasks/t2/complete" "$WORK/fake.log")" = 1 ] && grep -q "t2: reporting it answered 409" "$WORK/work2.err"'
check "work: after the retries it still drains and exits 0" [ "$WRC" = 0 ]
# A 2 s lease: a complete that keeps getting 503 is given up when the lease
# runs out, and the slot claims again.
JACKDAW_URL=$FURL "$JDC" work --command fake --lease 2s -- "$WORK/prog2.sh" 2>"$WORK/work3.err" &
WPID=$!
for _ in $(seq 100); do grep -q "giving up" "$WORK/work3.err" && break; sleep 0.1; done
sleep 1.5 # one more (empty) claim
kill -TERM "$WPID"
wait "$WPID"
# shellcheck disable=SC2034 # used in the eval below
N3=$(grep -c "^/v1/tasks/t3/complete 503" "$WORK/fake.log")
check "work: a report still refused when the lease runs out is retried, then given up and logged" \
    eval '[ "$N3" -ge 2 ] && [ "$N3" -le 6 ] && grep -q "t3: .*giving up" "$WORK/work3.err"'
kill "$FPID" 2>/dev/null
wait "$FPID" 2>/dev/null

stop_server
finish
