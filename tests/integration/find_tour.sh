#!/bin/sh
# The README's "Finding and acting on many jobs" examples. Every command
# here is quoted in the README (test_find.sh checks the README holds this
# file's commands verbatim) and run against a real server.
JD=${JD:-http://127.0.0.1:8080}
H='Content-Type: application/json'

# Labels are indexed: find jobs by any of them (repeat label= to need all),
# by handler, by creation time, with state, queue and paging as before.
curl -s -X POST "$JD/v1/jobs" -H "$H" -d '{"handler": "echo", "args": {},
  "labels": {"team": "billing", "tier": "gold"}}'
curl -s "$JD/v1/jobs?label=team:billing&label=tier:gold&handler=echo&limit=10"
curl -s "$JD/v1/jobs?label=team:billing&created_after=2026-01-01T00:00:00Z"

# Cancel every queued job of a queue with a label: 202 and an operation to
# follow; it acts on the jobs that exist now, 500 at a time.
curl -s -X POST "$JD/v1/queues/reports/pause"
curl -s -X POST "$JD/v1/jobs" -H "$H" -d '{"handler": "echo", "args": {},
  "queue": "reports", "labels": {"team": "billing"}}'
OP=$(curl -s -X POST "$JD/v1/jobs/cancel" -H "$H" \
  -d '{"queue": "reports", "label": "team:billing", "state": "queued"}' \
  | sed 's/.*"id":"\([0-9]*\)".*/\1/')
sleep 1
curl -s "$JD/v1/operations/$OP"

# Retry the failed ones of a team; a filter matching nothing answers 200, 0.
curl -s -X POST "$JD/v1/jobs/retry" -H "$H" -d '{"label": "team:billing", "state": "failed"}'

# Delete a finished job and its history (204; 409 while it has not finished).
ID=$(curl -s -X POST "$JD/v1/jobs" -H "$H" -d '{"handler": "echo", "args": {}}' \
  | sed 's/.*"id":"\([0-9]*\)".*/\1/')
curl -s "$JD/v1/jobs/$ID?wait=10s" > /dev/null
curl -s -o /dev/null -w '%{http_code}\n' -X DELETE "$JD/v1/jobs/$ID"
