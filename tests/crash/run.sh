#!/usr/bin/env bash
# tests/crash/run.sh (`make crash`): the long crash-safety run, CRASH_ROUNDS
# (default 20) SIGKILLs of jackdawd under 8 concurrent clients; see crash.sh
# for what is asserted. Prints TAP and exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")" || exit 1
exec ./crash.sh "${CRASH_ROUNDS:-20}" "${CRASH_CLIENTS:-8}"
