#!/usr/bin/env bash
# Runs tests/integration/tour.sh (the README's API tour, verbatim) against a
# real server and checks what each command printed, so the tour keeps
# working when pasted into a shell. Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

start_server || exit 1
JD=$BASE timeout 60 sh tests/integration/tour.sh >"$WORK/tour.out" 2>"$WORK/tour.err"
rc=$?
OUT=$(cat "$WORK/tour.out")
BODY=$OUT
has() { grep -qF -- "$1" "$WORK/tour.out"; }
line() { sed -n "${1}p" "$WORK/tour.out"; }
check "the tour runs to the end (exit $rc)" eval '[ "$rc" = 0 ] && [ ! -s "$WORK/tour.err" ]'
first=$(line 1)
check "submit prints the queued job" eval 'grep -q "\"state\":\"queued\".*\"hello\":\"world\"" <<<"$first"'
check "wait prints it succeeded with its output" has '"state":"succeeded","queue":"default","priority":0,"version":5,"attempts":1,"output":{"hello":"world"}'
check "submit with ?wait= prints the finished job" has '"state":"succeeded","queue":"default","priority":0,"version":5,"attempts":1,"output":{"n":1}'
check "events as JSON" has '{"events":[{"seq":1,'
check "events as SSE, ending with the job" eval 'has "event: dispatch" && has "event: end"'
check "message accepted, workflow finished with it" eval 'has "\"output\":{\"greet\":{\"to\":\"ada\"},\"ok\":{\"by\":\"me\"}}"'
check "cancelled job" has '"state":"cancelled"'
check "batch of two" eval 'has "{\"jobs\":[{\"id\":" && has "\"queue\":\"other\""'
check "a Python worker served the remote command" has '"output":{"text":"HELLO FROM PYTHON","by":"python"}'
check "problem+json with a pointer" has '"pointer":"/steps/0/call"'
check "list, queues, handlers, readyz, metrics" eval 'has "\"next_cursor\":" && has "{\"queues\":[" && has "{\"plugins\":[" && has "{\"status\":\"ready\"}" && has "jackdaw_jobs_submitted_total "'
check "every JSON answer ends with a newline (one per line)" eval '[ "$(grep -c "^{" "$WORK/tour.out")" = 16 ]'
stop_server
finish
