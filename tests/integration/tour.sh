#!/bin/sh
# shellcheck disable=SC2016 # ${input.name} is for Jackdaw, not the shell
# The README's API tour. Every command here is quoted in the README and run
# by tests/integration/test_api_tour.sh against a real server, so the two
# cannot drift. Start a server first (make run), then paste these lines.
JD=${JD:-http://127.0.0.1:8080}
H='Content-Type: application/json'

# Submit a job: 201 comes back once it is durable, with the job as JSON.
curl -s -X POST "$JD/v1/jobs" -H "$H" -d '{"handler":"echo","args":{"hello":"world"}}'

# The same, keeping its id (from the Location header) in a variable.
ID=$(curl -s -o /dev/null -w '%header{location}' -X POST "$JD/v1/jobs" -H "$H" \
  -d '{"handler":"echo","args":{"hello":"world"}}' | cut -d/ -f4)

# Wait for it: returns as soon as the job is finished (or after 30 s).
curl -s "$JD/v1/jobs/$ID?wait=30s"

# Or submit and wait in one request: the answer is the finished job.
curl -s -X POST "$JD/v1/jobs?wait=30s" -H "$H" -d '{"handler":"echo","args":{"n":1}}'

# Its history as JSON, then as a live Server-Sent Events stream that ends
# with the job (add -H "Last-Event-ID: 3" to resume after event 3).
curl -s "$JD/v1/jobs/$ID/events"
curl -sN -H 'Accept: text/event-stream' "$JD/v1/jobs/$ID/events"

# A workflow that waits for an approval message; send it, wait for the result.
WF=$(curl -s -o /dev/null -w '%header{location}' -X POST "$JD/v1/jobs" -H "$H" -d '{
  "steps": [{"id": "greet", "call": "echo", "args": {"to": "${input.name}"}},
            {"id": "ok", "wait": "approval", "timeout_ms": 600000}],
  "input": {"name": "ada"}}' | cut -d/ -f4)
curl -s -X POST "$JD/v1/jobs/$WF/messages" -H "$H" -d '{"topic":"approval","data":{"by":"me"}}'
curl -s "$JD/v1/jobs/$WF?wait=30s"

# Cancel a long job: 202, then it ends "cancelled" (cancelling again: 409).
SL=$(curl -s -o /dev/null -w '%header{location}' -X POST "$JD/v1/jobs" -H "$H" \
  -d '{"handler":"sleep","args":{"ms":600000}}' | cut -d/ -f4)
curl -s -X POST "$JD/v1/jobs/$SL/cancel"
curl -s "$JD/v1/jobs/$SL?wait=30s"

# Many jobs in one request, all accepted in one commit (or none).
curl -s -X POST "$JD/v1/jobs/batch" -H "$H" -d '{"jobs": [
  {"handler": "echo", "args": {"n": 1}},
  {"handler": "echo", "args": {"n": 2}, "queue": "other"}]}'

# A remote command, served by a worker in Python that could run on any
# machine (examples/workers/python/worker.py, standard library only).
# Register it, submit a job that calls it (it waits as a durable task), then
# start the worker: it claims the task, runs it, and the job has its result.
curl -s -X PUT "$JD/v1/commands/py.upper" -H "$H" -d '{"description":"upper-cases text"}'
PJ=$(curl -s -o /dev/null -w '%header{location}' -X POST "$JD/v1/jobs" -H "$H" \
  -d '{"handler":"py.upper","args":{"text":"hello from python"}}' | cut -d/ -f4)
JACKDAW_URL=$JD python3 examples/workers/python/worker.py --commands py.upper 2>/dev/null &
WORKER=$!
curl -s "$JD/v1/jobs/$PJ?wait=30s"
kill $WORKER

# Errors are RFC 9457 problem+json, with a JSON pointer to the bad spot.
curl -s -X POST "$JD/v1/jobs" -H "$H" -d '{"steps":[{"id":"a","call":"htp"}]}'

# Listing, queues, plugins, health and metrics.
curl -s "$JD/v1/jobs?state=succeeded&limit=2"
curl -s "$JD/v1/queues"
curl -s "$JD/v1/handlers"
curl -s "$JD/readyz"
curl -s "$JD/metrics" | grep '^jackdaw_jobs_submitted_total'
