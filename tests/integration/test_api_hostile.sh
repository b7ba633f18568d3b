#!/usr/bin/env bash
# Hostile input: malformed, truncated, non-UTF-8 and deeply nested JSON,
# wrong content types, bodies over --max-body with and without
# Content-Length (chunked), absurd numbers, huge strings, thousands of steps,
# unknown routes and methods, oversized URLs and headers, slow clients, and
# too many parked waiters. Each gets its 4xx (as problem+json where the
# server answers), and afterwards the server is still up and correct.
# Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

start_server --max-body 256k --conn-timeout 2s --max-parked 2 || exit 1
PORT=${BASE##*:}

# ---- JSON ----
bad_json() { # name body want
    json_post /v1/jobs "$2"
    check "$1: $3" is_problem "$3"
}
bad_json "truncated JSON" '{"handler":"echo","args":{"v":' 400
bad_json "malformed JSON" '{"handler" "echo"}' 400
bad_json "trailing garbage" '{"handler":"echo"} x' 400
bad_json "bare scalar" '42' 422
bad_json "array instead of object" '[{"handler":"echo"}]' 422
bad_json "empty object" '{}' 422
printf '{"handler":"echo","args":{"v":"\xff\xfe"}}' >"$WORK/nonutf8"
req POST /v1/jobs -H 'Content-Type: application/json' --data-binary @"$WORK/nonutf8"
check "non-UTF-8 bytes: 400" is_problem 400
printf '{"handler":"echo","args":{"v":"\xc0\xaf"}}' >"$WORK/overlong"
req POST /v1/jobs -H 'Content-Type: application/json' --data-binary @"$WORK/overlong"
check "overlong UTF-8: 400" is_problem 400
req POST /v1/jobs -H 'Content-Type: application/json'
check "empty body: 400" is_problem 400
deep=$(printf '%*s' 5000 '' | tr ' ' '[')
json_post /v1/jobs "{\"handler\":\"echo\",\"args\":{\"v\":$deep}}"
check "5000-deep nesting (unterminated): 4xx" eval '[[ "$STATUS" == 4* ]] && header_has "application/problem+json"'
deep_ok=$(printf '%*s' 200 '' | tr ' ' '[')$(printf '%*s' 200 '' | tr ' ' ']')
json_post /v1/jobs "{\"handler\":\"echo\",\"args\":{\"v\":$deep_ok}}"
check "200-deep nesting (well-formed): 4xx" eval '[[ "$STATUS" == 4* ]] && header_has "application/problem+json"'

# ---- content types ----
for ct in text/plain application/x-www-form-urlencoded 'multipart/form-data; boundary=x' application/xml; do
    req POST /v1/jobs -H "Content-Type: $ct" --data-binary '{"handler":"echo"}'
    check "Content-Type $ct: 415" is_problem 415
done
req POST /v1/jobs/batch -H 'Content-Type: text/csv' --data-binary 'a,b'
check "batch with text/csv: 415" is_problem 415

# ---- sizes ----
head -c 300000 /dev/zero | tr '\0' ' ' >"$WORK/big"
req POST /v1/jobs -H 'Content-Type: application/json' --data-binary @"$WORK/big"
check "body over --max-body with Content-Length: 413" is_problem 413
req POST /v1/jobs -H 'Content-Type: application/json' -H 'Transfer-Encoding: chunked' --data-binary @"$WORK/big"
check "body over --max-body, chunked (no Content-Length): 413" is_problem 413
head -c 3000000 /dev/zero | tr '\0' ' ' >"$WORK/huge"
req POST /v1/jobs -H 'Content-Type: application/json' -H 'Transfer-Encoding: chunked' --data-binary @"$WORK/huge"
check "3 MB chunked body: 413" is_problem 413
{
    printf '{"handler":"echo","args":{"v":"'
    head -c 200000 /dev/zero | tr '\0' a
    printf '"}}'
} >"$WORK/bigstr"
req POST /v1/jobs -H 'Content-Type: application/json' --data-binary @"$WORK/bigstr"
check "a 200 KB string value: 4xx" eval '[[ "$STATUS" == 4* ]] && header_has "application/problem+json"'
steps=$(for i in $(seq 1 3000); do printf '{"id":"s%d","call":"echo","args":{}},' "$i"; done)
json_post /v1/jobs "{\"steps\":[${steps%,}]}"
check "3000 steps: 4xx" eval '[[ "$STATUS" == 4* ]] && header_has "application/problem+json"'

# ---- absurd numbers ----
for def in '{"handler":"echo","priority":1e400}' '{"handler":"echo","delay_ms":-5}' \
    '{"handler":"echo","timeout_ms":99999999999999999999999}' '{"handler":"echo","priority":"high"}' \
    '{"handler":"echo","run_at":"yesterday"}' '{"handler":"echo","retry":{"max_attempts":-1}}' \
    '{"steps":[{"id":"z","sleep_ms":1e30}]}'; do
    json_post /v1/jobs "$def"
    check "absurd value $def: 4xx" eval '[[ "$STATUS" == 4* ]] && header_has "application/problem+json"'
done
req GET "/v1/jobs/99999999999999999999999999"
check "job id overflowing int64: 404" is_problem 404
req GET "/v1/jobs?limit=-1"
check "negative limit: 400" is_problem 400
req GET "/v1/jobs/1?wait=99999999999999999999s"
check "absurd wait: 4xx or capped" eval '[[ "$STATUS" == 4* ]] || [ "$STATUS" = 404 ]'
json_post /v1/jobs '{"handler":"echo"}' -H "Idempotency-Key: $(head -c 400 /dev/zero | tr '\0' k)"
check "Idempotency-Key over 255 characters: 400" is_problem 400

# ---- routes and methods ----
for m in PATCH PUT DELETE OPTIONS; do
    req "$m" /v1/jobs
    check "$m /v1/jobs: 405 with Allow" eval 'is_problem 405 && header_has "Allow: GET, HEAD, POST"'
done
req BREW /v1/jobs
check "unknown method BREW: 405" is_problem 405
for p in /v1/jobs/1/nope /v1/jobs//1 /v1/../etc/passwd /admin '/v1/jobs/%2e%2e' /v1/jobs/1/events/x; do
    req GET "$p" --path-as-is
    check "GET $p: 4xx" eval '[[ "$STATUS" == 4* ]]'
done
long_path="/v1/jobs/$(head -c 20000 /dev/zero | tr '\0' 1)"
req GET "$long_path"
check "a 20 KB URL: 4xx" eval '[[ "$STATUS" == 4* ]]'
req GET /livez -H "X-Big: $(head -c 40000 /dev/zero | tr '\0' h)"
check "a 40 KB header: 4xx" eval '[[ "$STATUS" == 4* ]]'

# ---- too many parked waiters (--max-parked 2) ----
json_post /v1/jobs '{"steps":[{"id":"w","wait":"never","timeout_ms":60000}]}'
PARKJ=$(location_id)
parked=()
for _ in 1 2; do
    curl -s -o /dev/null --max-time 15 "$BASE/v1/jobs/$PARKJ?wait=10s" &
    parked+=($!)
done
sleep 0.5
req GET "/v1/jobs/$PARKJ?wait=10s"
check "third parked waiter over --max-parked: 429 with Retry-After" eval 'is_problem 429 && header_has "Retry-After: "'
req GET /v1/jobs/"$PARKJ"/events -H 'Accept: text/event-stream'
check "SSE over --max-parked: 429" is_problem 429
req POST "/v1/jobs/$PARKJ/cancel"
wait "${parked[@]}"
check "parked waiters released by the job's end" eval 'status_is 202'

# ---- slow clients ----
# Headers that never finish: the connection is closed after --conn-timeout.
exec 4<>"/dev/tcp/127.0.0.1/$PORT"
printf 'GET /livez HTTP/1.1\r\nHost: x\r\nX-Slow: ' >&4
t0=$(date +%s)
cat <&4 >/dev/null
slow=$(($(date +%s) - t0))
exec 4<&-
check "slowloris headers: closed after the idle timeout (${slow}s)" eval '[ "$slow" -ge 1 ] && [ "$slow" -le 8 ]'
# A body that stops half-way.
exec 5<>"/dev/tcp/127.0.0.1/$PORT"
printf 'POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"handler":' >&5
t0=$(date +%s)
cat <&5 >/dev/null
slow=$(($(date +%s) - t0))
exec 5<&-
check "stalled body: closed after the idle timeout (${slow}s)" eval '[ "$slow" -ge 1 ] && [ "$slow" -le 8 ]'
# Many idle connections at once do not stop others being served.
idle=()
for i in $(seq 10 40); do
    eval "exec $i<>/dev/tcp/127.0.0.1/$PORT" && idle+=("$i")
done
req GET /livez
check "served while 31 idle connections are open" status_is 200
for i in "${idle[@]}"; do eval "exec $i<&-"; done
# Garbage instead of HTTP (in a subshell: the server may close first, and a
# write to a closed socket would SIGPIPE this script).
reply=$(
    exec 6<>"/dev/tcp/127.0.0.1/$PORT" || exit 0
    trap '' PIPE
    head -c 2000 /dev/urandom >&6 2>/dev/null
    printf '\r\n\r\n' >&6 2>/dev/null
    head -c 12 <&6 2>/dev/null | tr -d '\0'
)
check "random bytes: 400 or closed (${reply:-closed})" eval '[ -z "$reply" ] || [[ "$reply" == "HTTP/1.1 4"* ]]'

# ---- still up and correct ----
req GET /readyz
check "still ready afterwards" status_is 200
json_post /v1/jobs '{"handler":"echo","args":{"after":"storm"}}'
ID=$(location_id)
wait_job "$ID"
check "a normal job still succeeds" eval 'body_has "\"state\":\"succeeded\"" && body_has "\"output\":{\"after\":\"storm\"}"'
req GET /metrics
check "413s and 429s are counted" eval 'body_has "jackdaw_http_body_rejected_total" && ! body_has "jackdaw_http_body_rejected_total 0" && ! body_has "jackdaw_http_parked_rejected_total 0"'
check "server process alive" kill -0 "$SERVER_PID"
stop_server
check "exit 0" [ "$SERVER_RC" = 0 ]
finish
