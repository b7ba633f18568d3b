#!/usr/bin/env bash
# The dashboard in a real browser: Debian's chromium driven by puppeteer-core
# (tests/ui/dashboard.mjs) against the real jackdawd, plus its HTTP contract
# with curl (content types, ETag/304, CSP, --ui off). Screenshots of every
# page at 1280 and 390 px go to $BUILD/ui-screenshots/. Prints TAP.
#
# Skips (one "ok # SKIP" line saying why) only when chromium cannot start
# here; a missing node or puppeteer-core is a failure (make test installs
# them: make ui-deps).
# shellcheck disable=SC2016,SC2034,SC2119 # conditions are single-quoted for eval; DB is read by lib.sh
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/../integration/lib.sh"
UIDIR=tests/ui
SHOTS=$BUILD/ui-screenshots
mkdir -p "$SHOTS"
CHROMIUM=${CHROMIUM:-$(command -v chromium || true)}

# ---- the HTTP side, with curl ----
start_server || exit 1
req GET /
check "GET / redirects to /ui/" eval 'status_is 302 && header_has "Location: /ui/"'
req GET /ui
check "GET /ui redirects to /ui/" eval 'status_is 302 && header_has "Location: /ui/"'
req GET /ui/
check "GET /ui/ is the page, as HTML" eval 'status_is 200 && header_has "Content-Type: text/html; charset=utf-8" && body_has "<script type=\"module\" src=\"app.js\">"'
check "the page's CSP allows this origin only, no inline script" eval 'header_has "Content-Security-Policy: default-src '\''none'\''; script-src '\''self'\'';" && ! header_has "unsafe-inline"'
check "nosniff and no-cache" eval 'header_has "X-Content-Type-Options: nosniff" && header_has "Cache-Control: no-cache"'
ETAG=$(sed -n 's/^ETag: //Ip' <<<"$HDRS")
req GET /ui/ -H "If-None-Match: $ETAG"
check "If-None-Match with the ETag: 304, no body" eval '[ -n "$ETAG" ] && status_is 304 && [ -z "$BODY" ]'
req GET /ui/app.js
check "JavaScript modules as text/javascript" eval 'status_is 200 && header_has "Content-Type: text/javascript; charset=utf-8"'
req GET /ui/app.css
check "CSS as text/css" eval 'status_is 200 && header_has "Content-Type: text/css; charset=utf-8"'
check "every file served is the file in ui/ (compiled in)" eval 'for f in ui/*.*; do [ "$f" = ui/README.md ] && continue; req GET "/ui/${f#ui/}"; status_is 200 && cmp -s "$f" "$WORK/body" || exit 1; done'
req GET /ui/nope.js
check "an unknown file: 404 problem" is_problem 404
req GET /ui/app.js --head
check "HEAD of a file: 200" status_is 200
req GET "/v1/stats?seconds=901"
check "/v1/stats?seconds=901: 400" is_problem 400
json_post /v1/jobs '{"handler":"fail","args":{}}'
F=$(location_id)
wait_job "$F"
req GET "/v1/stats?seconds=60"
check "/v1/stats counts the failed job in its queue, in the last second" eval 'status_is 200 && body_has "\"seconds\":60" && body_has "\"name\":\"default\"" && body_has "\"totals\":{\"succeeded\":0,\"failed\":1,\"cancelled\":0}"'
req POST /v1/queues/held/pause
json_post /v1/jobs '{"handler":"echo","args":{},"queue":"held"}'
H1=$(location_id)
json_post /v1/jobs '{"handler":"echo","args":{},"queue":"held"}'
req GET "/v1/stats?seconds=1"
check "/v1/stats names the oldest queued job of a paused queue" body_has "{\"queue\":\"held\",\"id\":\"$H1\""
stop_server

start_server --ui off || exit 1
req GET /ui/
check "--ui off: /ui/ is 404" is_problem 404
req GET /
check "--ui off: / is 404" is_problem 404
stop_server

# ---- the browser ----
# One run of dashboard.mjs: its TAP lines shown (numbered by it) and counted here.
browser_phase() {
    CHROMIUM=$CHROMIUM timeout 300 node "$UIDIR/dashboard.mjs" "$1" "$BASE" "$SHOTS" >"$WORK/$1.tap" 2>&1
    local rc=$?
    cat "$WORK/$1.tap"
    local n
    n=$(grep -c '^\(not \)\{0,1\}ok [0-9]' "$WORK/$1.tap")
    TAPN=$((TAPN + n))
    if grep -q '^not ok' "$WORK/$1.tap" || [ "$rc" -ne 0 ] || [ "$n" -eq 0 ]; then
        FAILED=$((FAILED + 1))
        [ "$n" -gt 0 ] || notok "browser phase $1 reported no tests (exit $rc)"
    fi
}

skip() {
    TAPN=$((TAPN + 1))
    echo "ok $TAPN - browser tests # SKIP $1"
    echo "ui tests: SKIPPED the browser part: $1" >&2
}
if ! command -v node >/dev/null; then
    notok "node is installed (make deps installs nodejs)"
elif [ ! -d "$UIDIR/node_modules/puppeteer-core" ]; then
    notok "puppeteer-core is installed in $UIDIR (make ui-deps)"
elif [ -z "$CHROMIUM" ]; then
    skip "no chromium on this machine (make deps installs it)"
elif ! why=$(timeout 60 "$CHROMIUM" --headless --no-sandbox --disable-gpu --dump-dom about:blank 2>&1 >/dev/null); then
    skip "chromium cannot run here ($CHROMIUM --headless failed): $(tail -n 2 <<<"$why" | tr "\n" " ")"
else
    DB=$WORK/browser.db # a database of its own: the counts checked start from zero
    start_server --sync normal || exit 1
    browser_phase main
    stop_server
    DB=$WORK/token.db
    start_server --token s3cret --sync normal || exit 1
    browser_phase token
    stop_server
    echo "# screenshots in $SHOTS"
fi
finish
