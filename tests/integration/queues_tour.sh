#!/bin/sh
# The README's "Queue controls" examples. Every command here is quoted in
# the README (test_queue_limits.sh checks the README holds this file's
# commands verbatim) and run against a real server, so the two cannot drift.
JD=${JD:-http://127.0.0.1:8080}
H='Content-Type: application/json'

# At most 2 "emails" jobs running at once, at most 10 started per second
# (bursts of 10), succeeded ones kept a day and failed ones 30 days
# whatever --retention says. 200 and the queue, once it is durable.
curl -s -X PUT "$JD/v1/queues/emails" -H "$H" -d '{
  "max_running": 2, "rate": {"limit": 10, "per": "1s"},
  "retention": {"succeeded": "1d", "failed": "30d"}}'

# Jobs beyond the limits wait "queued"; the queue shows its controls, its
# counts, the jobs holding a running slot ("active") and the starts the
# rate allows right now ("rate_available").
curl -s -X POST "$JD/v1/jobs" -H "$H" \
  -d '{"queue": "emails", "handler": "echo", "args": {"to": "ann"}}'
curl -s "$JD/v1/queues/emails"

# A PUT replaces the whole set: this one lifts the rate and the retention.
curl -s -X PUT "$JD/v1/queues/emails" -H "$H" -d '{"max_running": 5}'

# Out of range: 422 with a pointer to the field.
curl -s -X PUT "$JD/v1/queues/emails" -H "$H" -d '{"rate": {"limit": 0, "per": "1s"}}'

# Unique jobs: at most one live job per key. The first is 201; the same key
# again answers 200 with that job ("on_conflict": "return_existing", the
# default), 409 naming it ("reject"), or, while the holder is still queued,
# cancels it and takes its place ("replace").
curl -s -X POST "$JD/v1/jobs" -H "$H" -d '{"handler": "sleep", "args": {"ms": 2000},
  "unique": {"key": "user-42-sync"}}'
curl -s -o /dev/null -w '%{http_code}\n' -X POST "$JD/v1/jobs" -H "$H" \
  -d '{"handler": "sleep", "args": {"ms": 2000}, "unique": {"key": "user-42-sync"}}'
curl -s -X POST "$JD/v1/jobs" -H "$H" -d '{"handler": "sleep", "args": {"ms": 2000},
  "unique": {"key": "user-42-sync", "on_conflict": "reject"}}'
