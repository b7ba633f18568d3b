#!/usr/bin/env bash
# tests/fuzz/run.sh SECONDS: build the libFuzzer harnesses with clang
# (-fsanitize=fuzzer,address,undefined) into $JD_BUILD/fuzz and run each for
# SECONDS, starting from the seed corpus in tests/fuzz/corpus/<name> (new
# inputs go to $JD_BUILD/fuzz/corpus-<name>, the repository is not touched).
# Prints one TAP line per harness; a crash leaves its input in
# $JD_BUILD/fuzz/crash-* and the log in $JD_BUILD/fuzz/<name>.log.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
SECS=${1:-60}
BUILD=${JD_BUILD:-build}
OUT=$BUILD/fuzz
mkdir -p "$OUT"
CC=${FUZZ_CC:-clang}
if ! command -v "$CC" >/dev/null; then
    echo "ok 1 - # SKIP no clang"
    exit 0
fi
# shellcheck disable=SC2054 # commas belong to -fsanitize=
CFLAGS=(-std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I.)
read -r -a PKG_CFLAGS <<<"$(pkg-config --cflags libcjson sqlite3 libpq)"
read -r -a PKG_LIBS <<<"$(pkg-config --libs libcjson sqlite3 libpq)"
LIBS=("${PKG_LIBS[@]}" -lpthread -ldl -lm)

CORE=(common/*.c)
JOBS=()
for f in scheduler/*.c storage/*.c plugins/*.c server/*.c; do
    [ "$f" = server/main.c ] || JOBS+=("$f")
done
declare -A SRCS=(
    [router]="api/router.c api/problem.c ${CORE[*]}"
    [jobdef]="${JOBS[*]} ${CORE[*]}"
    [cron]="${CORE[*]}"
)
n=0
failed=0
for name in router jobdef cron; do
    n=$((n + 1))
    bin=$OUT/fuzz_$name
    log=$OUT/$name.log
    read -r -a src <<<"${SRCS[$name]}"
    if ! "$CC" "${CFLAGS[@]}" "${PKG_CFLAGS[@]}" -o "$bin" "tests/fuzz/fuzz_$name.c" \
        "${src[@]}" "${LIBS[@]}" >"$log" 2>&1; then
        echo "not ok $n - fuzz_$name builds"
        sed 's/^/# /' "$log" | tail -n 20
        failed=$((failed + 1))
        continue
    fi
    corpus=$OUT/corpus-$name
    mkdir -p "$corpus"
    JD_FUZZ_PLUGINS=$BUILD/plugins ASAN_OPTIONS=detect_leaks=0 \
        "$bin" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -artifact_prefix="$OUT/" -print_final_stats=1 "$corpus" "tests/fuzz/corpus/$name" \
        >>"$log" 2>&1
    rc=$?
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$')
    if [ "$rc" -eq 0 ]; then
        echo "ok $n - fuzz_$name ran ${SECS}s (${runs:-?} inputs) without a finding"
    else
        echo "not ok $n - fuzz_$name (exit $rc; see $log)"
        grep -E 'ERROR|SUMMARY|crash-|Test unit written' "$log" | head -n 10 | sed 's/^/# /'
        failed=$((failed + 1))
    fi
done
[ "$failed" -eq 0 ]
