#!/usr/bin/env bash
# The short fuzz run that is part of `make test`: each libFuzzer harness for
# about 10 s when clang is present (tests/fuzz/run.sh), else one skipped TAP
# line. `make fuzz` runs the same harnesses for 60 s each.
cd "$(dirname "$0")/../.." || exit 1
if ! command -v "${FUZZ_CC:-clang}" >/dev/null; then
    echo "ok 1 - # SKIP no clang"
    exit 0
fi
exec tests/fuzz/run.sh "${FUZZ_SHORT_SECONDS:-10}"
