#!/usr/bin/env bash
# --token / JACKDAW_TOKEN: every /v1 route needs "Authorization: Bearer
# <token>"; health and metrics stay open; a flag wins over the variable; with
# no token (the default) /v1 is open. Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

start_server --token s3cret || exit 1
json_post /v1/jobs '{"handler":"echo","args":{"a":1}}'
check "no Authorization: 401 problem" eval 'is_problem 401 && header_has "WWW-Authenticate: Bearer"'
json_post /v1/jobs '{"handler":"echo","args":{"a":1}}' -H 'Authorization: Bearer s3cre'
check "wrong token (a prefix): 401" is_problem 401
json_post /v1/jobs '{"handler":"echo","args":{"a":1}}' -H 'Authorization: Bearer s3cret-and-more'
check "wrong token (longer): 401" is_problem 401
json_post /v1/jobs '{"handler":"echo","args":{"a":1}}' -H 'Authorization: Basic czNjcmV0'
check "another scheme: 401" is_problem 401
json_post /v1/jobs '{"handler":"echo","args":{"a":1}}' -H 'Authorization: Bearer s3cret'
check "right token: 201" status_is 201
ID=$(location_id)
for path in "/v1/jobs/$ID" /v1/jobs "/v1/jobs/$ID/events" /v1/handlers /v1/queues /v1/openapi.yaml; do
    req GET "$path"
    check "GET $path without a token: 401" is_problem 401
    req GET "$path" -H 'Authorization: bearer s3cret'
    check "GET $path with the token: 200" status_is 200
done
for path in "/v1/jobs/$ID/cancel" "/v1/jobs/$ID/retry" /v1/queues/q/pause /v1/jobs/batch; do
    req POST "$path"
    check "POST $path without a token: 401" is_problem 401
done
for path in /livez /readyz /metrics; do
    req GET "$path"
    check "GET $path is open" status_is 200
done
stop_server

JACKDAW_TOKEN=fromenv start_server || exit 1
req GET /v1/handlers -H 'Authorization: Bearer fromenv'
check "JACKDAW_TOKEN sets the token" status_is 200
req GET /v1/handlers
check "JACKDAW_TOKEN: no header, 401" is_problem 401
stop_server

JACKDAW_TOKEN=fromenv start_server --token fromflag || exit 1
req GET /v1/handlers -H 'Authorization: Bearer fromflag'
check "--token wins over JACKDAW_TOKEN" status_is 200
req GET /v1/handlers -H 'Authorization: Bearer fromenv'
check "--token wins: the variable's token is refused" is_problem 401
stop_server

start_server || exit 1
req GET /v1/handlers
check "no token configured: /v1 is open" status_is 200
stop_server
check "exit 0 after SIGTERM" [ "$SERVER_RC" = 0 ]
finish
