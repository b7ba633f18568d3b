#!/usr/bin/env bash
# The exec and http handlers against a job that tries to escape them
# (issue 12): env names that hook the loader or an interpreter are refused
# with 422 at submit and fail the step when they arrive by substitution;
# children see only fds 0-2; background children die with their job; a
# hung child meets the default deadline; link-local URLs and framing
# headers are refused. Prints TAP.
# ${...} in single quotes are Jackdaw substitutions, not shell ones.
# shellcheck disable=SC2016,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

start_server --exec-allow /usr/bin/ldd,/bin/sh,/bin/ls --exec-timeout 1s || exit 1

# The bypass from the issue: only a bash script is allowed, and an exported
# function named like a builtin it calls would run another program.
json_post /v1/jobs '{"handler":"exec","args":{"argv":["/usr/bin/ldd","--version"],
  "env":{"BASH_FUNC_printf%%":"() { /usr/bin/id; }"}}}'
check "BASH_FUNC_printf%% refused at submit (422)" status_is 422
check "with a pointer at the env member" body_has '"pointer":"/args/env/BASH_FUNC_printf%%"'
json_post /v1/jobs '{"handler":"exec","args":{"argv":["/bin/sh","-c","true"],
  "env":{"LD_PRELOAD":"/tmp/x.so"}}}'
check "LD_PRELOAD refused at submit (422)" status_is 422

# The same env arriving through a substitution of the job's input is
# checked after substitution. (At run time, exec checks again: a process
# type may yield any args; the unit tests drive that path.)
json_post /v1/jobs '{"handler":"exec","args":{"argv":["/usr/bin/ldd","--version"],
  "env":"${input.e}"},"input":{"e":{"BASH_FUNC_printf%%":"() { /usr/bin/id; }"}}}'
check "substituted env refused at submit (422)" status_is 422
check "substituted env: pointer at the env member" body_has '/env/BASH_FUNC_printf%%"'

# Only 0, 1, 2 reach a child (3 is the directory ls opens to list).
json_post /v1/jobs '{"handler":"exec","args":{"argv":["/bin/ls","/proc/self/fd"]}}'
ID=$(location_id)
wait_job "$ID"
check "a child sees only fds 0-2" body_has '"stdout":"0\n1\n2\n3\n"'

# A background child does not outlive its job.
json_post /v1/jobs '{"handler":"exec","args":{"argv":["/bin/sh","-c","sleep 1234.5 & echo started"]}}'
ID=$(location_id)
wait_job "$ID"
check "the job succeeds" body_has '"state":"succeeded"'
gone=1
for _ in $(seq 50); do
    if pgrep -f 'sleep 1234.5' >/dev/null; then gone=0; sleep 0.1; else gone=1; break; fi
done
check "and leaves no sleep behind" [ "$gone" = 1 ]
pkill -f 'sleep 1234.5' 2>/dev/null || true

# --exec-timeout: a job that gives no timeout_ms still has a deadline.
json_post /v1/jobs '{"handler":"exec","args":{"argv":["/bin/sh","-c","sleep 30"]}}'
ID=$(location_id)
wait_job "$ID" 20s
check "a hung child is killed at --exec-timeout" body_has '"kind":"timeout"'

# http: link-local (cloud metadata) refused with no --http-allow at all,
# framing headers refused.
json_post /v1/jobs '{"handler":"http","args":{"url":"http://169.254.169.254/latest/meta-data/"}}'
check "metadata address refused (422)" status_is 422
check "pointer /args/url" body_has '"pointer":"/args/url"'
json_post /v1/jobs '{"handler":"http","args":{"url":"http://127.0.0.1:1/",
  "headers":{"Transfer-Encoding":"chunked"}}}'
check "Transfer-Encoding refused (422)" status_is 422
check "pointer at the header" body_has '"pointer":"/args/headers/Transfer-Encoding"'
stop_server
check "server stops cleanly" [ "$SERVER_RC" = 0 ]
finish
