#!/usr/bin/env bash
# tests/crash/test_crash_short.sh (run by `make test`): the crash-safety run
# of crash.sh kept under a minute: 3 SIGKILLs of jackdawd under 4 concurrent
# clients. Same assertions as `make crash`: no acknowledged job lost, every
# job terminal, no recorded step run again.
set -uo pipefail
cd "$(dirname "$0")" || exit 1
exec ./crash.sh 3 4
