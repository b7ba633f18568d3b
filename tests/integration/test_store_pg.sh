#!/usr/bin/env bash
# The store's unit tests on PostgreSQL (issue 16): the same cmocka programs
# that run on SQLite in `make test`, run again with JD_TEST_PG_URL pointing
# at a throwaway PostgreSQL (tests/pg/pg.sh), so each test opens the store
# on a freshly emptied database instead of a SQLite file. One TAP line per
# cmocka test; tests about SQLite files themselves report a skip.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=tests/pg/pg.sh
. tests/pg/pg.sh

if ! pg_start nofsync; then
    notok "a throwaway PostgreSQL starts (tests/pg/pg.sh)"
    finish
fi
export JD_TEST_PG_URL=$PG_URL

for prog in test_store test_store_schedules test_store_concurrent test_store_find test_store_pg \
    test_pg_read test_store_cluster; do
    bin=$BUILD/tests/$prog
    if [ ! -x "$bin" ]; then
        notok "$prog is built ($bin; make unit-build)"
        continue
    fi
    out=$WORK/$prog.log
    timeout 120 "$bin" >"$out" 2>&1
    rc=$?
    seen=0
    while read -r kind name; do
        seen=$((seen + 1))
        case $kind in
        OK) ok "$prog: $name" ;;
        SKIPPED) ok "$prog: $name # SKIP SQLite only" ;;
        *) notok "$prog: $name" "$(grep -B2 -A8 -- "$name" "$out" | tail -20)" ;;
        esac
    done < <(sed -nE 's/^\[ +(OK|FAILED|SKIPPED) +\] (test_[A-Za-z0-9_]+)$/\1 \2/p' "$out" | sort -u -k2,2)
    if [ "$seen" = 0 ] || { [ "$rc" != 0 ] && ! grep -q '^\[  FAILED  \] test_' "$out"; }; then
        notok "$prog ran (exit $rc)" "$(tail -20 "$out")"
    fi
done
finish
