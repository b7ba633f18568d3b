#!/usr/bin/env bash
# Run test programs and print one closing line "N passed, N failed".
#
# Each argument is an executable: a cmocka binary (its "[  PASSED  ] N" and
# "[  FAILED  ] N" summary lines are counted) or a script printing TAP lines
# ("ok N - name" / "not ok N - name"). A program that exits non-zero without
# reporting a failure (a crash, a sanitizer report) counts as one failure.
# Output of each program goes to $JD_BUILD/test-logs/<name>.log and is shown
# when it failed. A program that is missing or not executable counts as a
# failure.
set -uo pipefail
BUILD=${JD_BUILD:-build}
logs="$BUILD/test-logs"
mkdir -p "$logs"
passed=0
failed=0
for t in "$@"; do
    # A test that was not built (or lost its x bit) is a failure, not a
    # silent skip: otherwise a suite can go green with tests missing.
    if [ ! -f "$t" ] || [ ! -x "$t" ]; then
        echo "FAIL $t (missing or not executable)"
        failed=$((failed + 1))
        continue
    fi
    name=$(echo "$t" | tr '/' '_')
    log="$logs/$name.log"
    start=$(date +%s.%N)
    timeout --kill-after=10 "${JD_TEST_TIMEOUT:-600}" "$t" >"$log" 2>&1
    rc=$?
    secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN{printf "%.1f", e-s}')
    p=0
    f=0
    if grep -q '^\[==========\]' "$log"; then
        p=$(grep -E '^\[  PASSED  \] [0-9]+' "$log" | awk '{s+=$4} END{print s+0}')
        f=$(grep -E '^\[  FAILED  \] [0-9]+ test' "$log" | awk '{s+=$4} END{print s+0}')
    else
        p=$(grep -cE '^ok [0-9]+' "$log")
        f=$(grep -cE '^not ok [0-9]+' "$log")
    fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        f=1
    fi
    if [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then
        echo "  ?? $t reported no tests" >&2
        f=1
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    if [ "$f" -ne 0 ]; then
        echo "FAIL $t ($p passed, $f failed, exit $rc, ${secs}s); log: $log"
        tail -n 40 "$log" | sed 's/^/    /'
    else
        echo "ok   $t ($p passed, ${secs}s)"
        # A skip is said out loud, with its reason, never only in the log.
        grep -E '^ok [0-9]+ .*# SKIP' "$log" | sed "s|^|    skipped in $t: |"
    fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
