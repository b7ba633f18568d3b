#!/bin/sh
# The README's "Schedules" examples. Every command here is quoted in the
# README (test_schedules.sh checks the README holds this file's commands
# verbatim) and run against a real server, so the two cannot drift.
JD=${JD:-http://127.0.0.1:8080}
H='Content-Type: application/json'

# Every night at 03:00 Berlin time: 201 and the schedule, with its next five
# fire times (in UTC: 02:00 in winter, 01:00 in summer).
curl -s -X PUT "$JD/v1/schedules/nightly-report" -H "$H" -d '{
  "cron": "0 3 * * *", "timezone": "Europe/Berlin",
  "job": {"handler": "echo", "args": {"report": "daily"}},
  "labels": {"team": "data"}}'

# Every two seconds. A fire whose previous job is still running is skipped
# ("overlap": "skip", the default); after downtime the newest missed fire
# runs once ("catchup": "latest", the default).
curl -s -X PUT "$JD/v1/schedules/heartbeat" -H "$H" -d '{
  "every": "2s", "overlap": "skip", "catchup": "latest",
  "job": {"handler": "echo", "args": {"ping": true}}}'

# Run one once now, whatever its timetable: 201 and the job.
curl -s -X POST "$JD/v1/schedules/nightly-report/trigger"

# The jobs a schedule made (labelled {"schedule": "<id>"}, with the fire
# time each was made for), and the schedule's own history.
sleep 5
curl -s "$JD/v1/jobs?schedule=heartbeat&limit=2"
curl -s "$JD/v1/schedules/heartbeat/events?limit=3"

# Pause (no fires until resumed), resume (fires from now on), list, delete.
curl -s -X POST "$JD/v1/schedules/heartbeat/pause"
curl -s -X POST "$JD/v1/schedules/heartbeat/resume"
curl -s "$JD/v1/schedules?limit=10"
curl -s -o /dev/null -w '%{http_code}\n' -X DELETE "$JD/v1/schedules/heartbeat"

# A bad expression: 422, the field and the reason, and a pointer to /cron.
curl -s -X PUT "$JD/v1/schedules/typo" -H "$H" \
  -d '{"cron": "0 25 * * *", "job": {"handler": "echo"}}'
