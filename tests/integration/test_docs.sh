#!/usr/bin/env bash
# The documentation matches the tree: every repository path named in
# README.md and docs/*.md exists, nothing points at design notes a person
# who clones the project does not have, the README keeps the sections its
# readers look for, every route of api/openapi.yaml is described, the
# README's tours are the scripts the integration tests run, and the
# include arrows docs/architecture.md ("Layers") allows are the only ones.
# No server is started. Prints TAP.
# shellcheck disable=SC2016 # quoted on purpose: eval and sed expand them
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

DOCS=(README.md docs/*.md)
TOPDIRS='api|bench|cli|common|docker|docs|plugins|scheduler|server|storage|tests|tools|ui'

# Repository paths named in a markdown file, one a line: a top-level
# directory followed by a path, not inside a URL or another path (so
# "/v1/jobs" and "build/plugins/x.so" are not taken), optionally written
# relative to docs/ ("../bench/RESULTS.md"). Trailing punctuation is cut.
paths_in() {
    grep -oE "(^|[^A-Za-z0-9_./-])(\.\./)?($TOPDIRS)/[A-Za-z0-9_./*<>-]*" "$1" |
        sed -E 's/^[^A-Za-z.]//; s/^\.\.\///; s/[.,:]+$//' | sort -u
}

missing_paths() {
    local f p bad=
    for f in "${DOCS[@]}" bench/RESULTS.md; do
        while IFS= read -r p; do
            case $p in
            *'<'* | *'>'*) continue ;; # a pattern such as plugins/<name>/
            *'*'*)
                # a glob such as api/routes_*.c names at least one file
                compgen -G "$p" >/dev/null || bad="$bad $f:$p"
                ;;
            *) [ -e "$p" ] || bad="$bad $f:$p" ;;
            esac
        done < <(paths_in "$f")
    done
    BODY="missing:$bad"
    [ -z "$bad" ]
}
check "every repository path named in README.md, docs/*.md and bench/RESULTS.md exists" \
    missing_paths

# Markdown links: a relative target exists (relative to the page), and an
# anchor names a heading of its page (GitHub's slugs: lower case, spaces to
# "-", other punctuation dropped).
slugs_of() { sed -nE 's/^#+ (.*)$/\1/p' "$1" | tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9 _-]//g; s/ /-/g'; }
broken_links() {
    local f t file anchor bad=
    for f in "${DOCS[@]}" bench/RESULTS.md plugins/README.md ui/README.md; do
        while IFS= read -r t; do
            case $t in http://* | https://* | mailto:*) continue ;; esac
            file=${t%%#*}
            anchor=
            [[ $t == *'#'* ]] && anchor=${t#*#}
            if [ -n "$file" ]; then
                file=$(dirname "$f")/$file
                [ -e "$file" ] || {
                    bad="$bad $f:$t"
                    continue
                }
            else
                file=$f
            fi
            if [ -n "$anchor" ] && [[ $file == *.md ]]; then
                grep -qx -- "$anchor" <<<"$(slugs_of "$file")" || bad="$bad $f:$t"
            fi
        done < <(grep -oE '\]\([^) ]+\)' "$f" | sed -E 's/^\]\(//; s/\)$//')
    done
    BODY="broken:$bad"
    [ -z "$bad" ]
}
check "every markdown link and anchor in the docs resolves" broken_links

paths_found() { [ "$(for f in "${DOCS[@]}"; do paths_in "$f"; done | wc -l)" -gt 100 ]; }
check "the path scan finds the paths (over 100 named)" paths_found

# The design notes the project started from live outside the repository;
# the tree must point at its own docs instead. The pattern is spelt so that
# this file does not match it.
outside_refs() {
    BODY=$(grep -rIlE '(DESIGN|STYLE|BENCH|SCALE_OUT)[.]md|/work/(shared|wt)' \
        --exclude-dir=node_modules --exclude-dir=.git \
        api bench cli common docker docs plugins scheduler server storage tests tools ui \
        README.md Makefile .ci 2>/dev/null)
    [ -z "$BODY" ]
}
check "no file refers to design notes or paths outside the repository" outside_refs

readme_sections() {
    local s bad=
    for s in 'The two commands' 'API tour' 'HTTP API' 'Job definitions' 'Schedules' \
        'Security' 'Inside' 'Performance' 'Deployment'; do
        grep -qx "## $s" README.md || bad="$bad '$s'"
    done
    BODY="missing sections:$bad"
    [ -z "$bad" ]
}
check "README has its sections (commands, tour, API, job definitions, security, performance, deploy)" \
    readme_sections
check "README links docs/architecture.md and docs/performance.md" \
    eval 'grep -q "](docs/architecture.md)" README.md && grep -q "](docs/performance.md)" README.md'
check "README's performance section is a summary (under 30 lines)" \
    eval '[ "$(sed -n "/^## Performance/,/^## /p" README.md | wc -l)" -lt 30 ]'

# Every path of api/openapi.yaml appears in README.md or docs/*.md as a
# whole path ("{id}" and "{queue}" match any "{...}").
routes_described() {
    local text p re bad=
    text=$(cat "${DOCS[@]}" | sed -E 's/\{[a-z_]+\}/{}/g')
    while IFS= read -r p; do
        re=$(sed -E 's/\{[a-z_]+\}/{}/g; s/[.{}]/\\&/g' <<<"$p")
        grep -qE "(^|[^A-Za-z0-9_/{}.-])$re([^A-Za-z0-9_/{}-]|$)" <<<"$text" || bad="$bad $p"
    done < <(sed -nE 's/^  (\/[^:]*):$/\1/p' api/openapi.yaml)
    BODY="not described:$bad"
    [ -z "$bad" ]
}
check "every route of api/openapi.yaml is described in README.md or docs/" routes_described
check "openapi.yaml has routes to check (over 20)" \
    eval '[ "$(grep -cE "^  /" api/openapi.yaml)" -gt 20 ]'

# The tours: the README quotes a script verbatim, and an integration test
# runs that script against a real server.
readme_block() { sed -n "/^## $1\$/,/^## /p" README.md | sed -n '/^```sh$/,/^```$/p' | sed '1d;$d'; }
check "README's API tour is tests/integration/tour.sh verbatim" \
    diff <(readme_block 'API tour') <(sed -n '/^JD=/,$p' tests/integration/tour.sh)
check "test_api_tour.sh runs tour.sh against a server" \
    eval 'grep -q "start_server" tests/integration/test_api_tour.sh &&
          grep -q "sh tests/integration/tour.sh" tests/integration/test_api_tour.sh'
check "README's schedules tour is schedules_tour.sh verbatim" \
    diff <(readme_block 'Schedules') <(sed -n '/^JD=/,$p' tests/integration/schedules_tour.sh)
check "test_schedules.sh runs schedules_tour.sh against a server" \
    eval 'grep -q "start_server" tests/integration/test_schedules.sh &&
          grep -q "sh tests/integration/schedules_tour.sh" tests/integration/test_schedules.sh'

# Include arrows (docs/architecture.md, "Layers"): for each file, every
# #include "..." must match one of its layer's allowed patterns.
includes_ok() {
    local allowed=$1 f inc bad=
    shift
    for f in "$@"; do
        while IFS= read -r inc; do
            [[ $inc =~ ^($allowed)$ ]] || bad="$bad $f->$inc"
        done < <(sed -nE 's/^#include "([^"]+)".*/\1/p' "$f")
    done
    BODY="forbidden:$bad"
    [ -z "$bad" ]
}
server_files() { for f in server/*.[ch]; do [ "$f" = server/main.c ] || echo "$f"; done; }
check "common/ includes only common/" includes_ok 'common/.*' common/*.[ch]
check "scheduler/ includes only common/" includes_ok '(common|scheduler)/.*' scheduler/*.[ch]
check "storage/ includes only common/" includes_ok '(common|storage)/.*' storage/*.[ch]
check "plugins/ includes common/ and scheduler/process.h only" \
    includes_ok '(common|plugins)/.*|scheduler/process\.h' plugins/*.[ch]
check "built-in plugins include only the plugin headers" \
    includes_ok 'plugins/(jackdaw_plugin|jackdaw_json|builtin)\.h' plugins/*/*.c
# shellcheck disable=SC2046
check "the job layer includes no api/ and no cli/" \
    includes_ok '(common|scheduler|storage|plugins|server)/.*' $(server_files)
check "api/ reaches storage and the scheduler only for store.h and sched.h" \
    includes_ok '(common|server|api)/.*|storage/store\.h|scheduler/sched\.h' api/*.[ch]
check "cli/ includes only common/" includes_ok '(common|cli)/.*' cli/*.[ch]

finish
