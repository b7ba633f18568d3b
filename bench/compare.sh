#!/usr/bin/env bash
# bench/compare.sh: Jackdaw's scheduler beside Tokio and Go, in one run.
#
# Role: run by `make bench-compare` (which first builds $JD_BUILD/bench/sched).
# Installs the peers' toolchains when missing (Debian: librust-tokio-dev,
# cargo, rustc, golang-go), builds the Tokio and Go peers offline (cached:
# cargo and go rebuild only what changed), then for every shape of
# docs/performance.md ("The scheduler shapes") runs the three programs in interleaved rounds
# (jackdaw, tokio, go, jackdaw, tokio, go, ...) with W workers and prints one
# table: medians with min/p90, the ratios jackdaw/tokio and jackdaw/go, the
# peak RSS of skynet, "worst ratio vs go: X.XX" and a last line
# "worst ratio vs tokio: X.XX".
#
# Invariants: every program speaks the same protocol,
#   PROG --shape NAME --iters N --workers W --raw
#   -> RESULT shape=NAME iters=N samples_ns=v1,...,vN rss_kb=K
# and runs one fresh runtime per invocation with one uncounted warm-up.
# An invocation that exceeds its time bound is reported "DNF (>Xs)" and that
# program is not run again on that shape; a program that crashes or prints no
# RESULT line is reported "ERR" (and the script exits 1). A missing or
# protocol-less Jackdaw binary is reported "missing", never hidden.
#
# Environment: JD_BUILD (build dir, default build), W (workers, default 2),
# QUICK=1 (under 2 minutes: fewer rounds and iterations), ROUNDS, ITERS,
# SKYNET_ITERS, LIMIT and BUSY2_LIMIT (seconds per invocation), SHAPES (a
# space-separated subset), PIN=1 (run Jackdaw with its workers pinned to
# CPUs, JD_PIN=1; the default is unpinned, as the peers run). Raw samples, table.txt and table.md (the same
# table in Markdown) are kept in $JD_BUILD/bench-compare/.
#
# Threading: sequential; one benchmark process at a time, so the programs never
# compete with each other for the machine's cores.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
JD_BUILD=${JD_BUILD:-build}
mkdir -p "$JD_BUILD"
BUILD_DIR=$(cd "$JD_BUILD" && pwd)
OUT="$BUILD_DIR/bench-compare"
PEERS="$BUILD_DIR/peers"
W=${W:-2}
QUICK=${QUICK:-0}
PIN=${PIN:-0}

if [ "$QUICK" = 1 ]; then
    ROUNDS=${ROUNDS:-2}
    ITERS=${ITERS:-8}
    SKYNET_ITERS=${SKYNET_ITERS:-2}
    LIMIT=${LIMIT:-30}
    BUSY2_LIMIT=${BUSY2_LIMIT:-5}
else
    # 4 rounds x 10 iterations: 40 samples per program per shape (docs/performance.md).
    ROUNDS=${ROUNDS:-4}
    ITERS=${ITERS:-10}
    SKYNET_ITERS=${SKYNET_ITERS:-10}
    LIMIT=${LIMIT:-120}
    # Tokio 1.24 practically hangs on busy2; a finished run takes well under 1 s.
    BUSY2_LIMIT=${BUSY2_LIMIT:-20}
fi
ALL_SHAPES="spawn_many_local spawn_many_remote_idle spawn_many_remote_busy1
spawn_many_remote_busy2 ping_pong yield_many chained_spawn skynet"
read -r -a SHAPE_LIST <<<"$(echo "${SHAPES:-$ALL_SHAPES}" | tr '\n' ' ')"
SYSTEMS=(jackdaw tokio go)

declare -A BIN NOTE STATUS RSS
ERRORS=0

say() { printf '%s\n' "$*" >&2; }

# ---- toolchains -------------------------------------------------------------

GO=""
find_go() {
    # Debian's Go, not whatever newer Go may be first on PATH.
    for g in /usr/lib/go-1.19/bin/go /usr/bin/go; do
        if [ -x "$g" ]; then
            GO=$g
            return 0
        fi
    done
    return 1
}

tokio_registry() { compgen -G '/usr/share/cargo/registry/tokio-1.*' >/dev/null; }

install_toolchains() {
    local need=() sudo=()
    [ -x /usr/bin/cargo ] || need+=(cargo)
    [ -x /usr/bin/rustc ] || need+=(rustc)
    tokio_registry || need+=(librust-tokio-dev)
    find_go || need+=(golang-go)
    [ ${#need[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null; then
            sudo=(sudo)
        else
            say "compare: need ${need[*]} but not root and no sudo; those peers will be missing"
            return 0
        fi
    fi
    say "compare: installing ${need[*]} with apt-get"
    if ! "${sudo[@]}" apt-get install -y --no-install-recommends "${need[@]}" >&2; then
        # A fresh image has no package lists yet.
        "${sudo[@]}" apt-get update >&2 || true
        "${sudo[@]}" apt-get install -y --no-install-recommends "${need[@]}" >&2 ||
            say "compare: apt-get install ${need[*]} failed"
    fi
    find_go || true
}

# ---- builds -----------------------------------------------------------------

build_tokio() {
    local dir="$ROOT/bench/peers/tokio"
    if [ ! -x /usr/bin/cargo ] || [ ! -x /usr/bin/rustc ] || ! tokio_registry; then
        NOTE[tokio]="missing: Debian cargo/rustc/librust-tokio-dev not installed"
        return 0
    fi
    # Debian's cargo cannot read a lock file written by a newer cargo (v4).
    if [ -f "$dir/Cargo.lock" ] && grep -q '^version = 4' "$dir/Cargo.lock"; then
        rm -f "$dir/Cargo.lock"
    fi
    # cargo looks for .cargo/config.toml from the working directory up.
    if (cd "$dir" && RUSTC=/usr/bin/rustc CARGO_TARGET_DIR="$PEERS/tokio" \
        /usr/bin/cargo build --release --quiet) >&2; then
        BIN[tokio]="$PEERS/tokio/release/jd-peer-tokio"
    else
        NOTE[tokio]="missing: cargo build failed"
        ERRORS=1
    fi
}

build_go() {
    local dir="$ROOT/bench/peers/go"
    if [ -z "$GO" ]; then
        NOTE[go]="missing: golang-go not installed"
        return 0
    fi
    if (cd "$dir" && GOPROXY=off GOFLAGS=-mod=mod GOTOOLCHAIN=local \
        "$GO" build -o "$PEERS/jd-peer-go" .) >&2; then
        BIN[go]="$PEERS/jd-peer-go"
    else
        NOTE[go]="missing: go build failed"
        ERRORS=1
    fi
}

probe_jackdaw() {
    local jd="$BUILD_DIR/bench/sched" out
    if [ ! -x "$jd" ]; then
        NOTE[jackdaw]="missing: $JD_BUILD/bench/sched not built"
        return 0
    fi
    out=$(timeout -k 2 20 "$jd" --shape chained_spawn --iters 1 --workers "$W" --raw 2>/dev/null) || true
    if grep -q '^RESULT shape=chained_spawn ' <<<"$out"; then
        BIN[jackdaw]=$jd
    else
        NOTE[jackdaw]="missing: $JD_BUILD/bench/sched does not speak --raw"
    fi
}

# ---- running ----------------------------------------------------------------

# run_one SYS SHAPE ITERS LIMIT: one invocation; appends its samples to
# $OUT/SHAPE.SYS.ns, keeps the largest rss_kb, sets STATUS on failure.
run_one() {
    local sys=$1 shape=$2 iters=$3 limit=$4 key="$2.$1" out rc=0 line samples rss count pin=
    [ "$sys" = jackdaw ] && [ "$PIN" = 1 ] && pin=1
    out=$(JD_PIN=$pin timeout -k 5 "$limit" "${BIN[$sys]}" --shape "$shape" --iters "$iters" \
        --workers "$W" --raw 2>>"$OUT/$key.err") || rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        STATUS[$key]="DNF (>${limit}s)"
        return 0
    fi
    line=$(grep -m1 "^RESULT shape=$shape " <<<"$out" || true)
    if [ "$rc" -ne 0 ] || [ -z "$line" ]; then
        STATUS[$key]="ERR (exit $rc)"
        ERRORS=1
        say "compare: $sys $shape failed (exit $rc); stderr in $OUT/$key.err"
        return 0
    fi
    samples=${line#*samples_ns=}
    samples=${samples%% *}
    rss=${line##*rss_kb=}
    count=$(tr ',' '\n' <<<"$samples" | grep -c '^[0-9][0-9]*$' || true)
    if [ "$count" -ne "$iters" ]; then
        STATUS[$key]="ERR (bad RESULT)"
        ERRORS=1
        say "compare: $sys $shape printed $count samples, wanted $iters: $line"
        return 0
    fi
    tr ',' '\n' <<<"$samples" >>"$OUT/$key.ns"
    if [[ $rss =~ ^[0-9]+$ ]] && [ "${RSS[$key]:-0}" -lt "$rss" ]; then RSS[$key]=$rss; fi
}

# ---- statistics and formatting ------------------------------------------------

# stats FILE -> "median min p90" in ns (median of an even count: mean of the
# two middle samples; p90: nearest rank).
stats() {
    sort -n "$1" | awk '{ v[NR] = $1 }
        END {
            n = NR
            if (n % 2) med = v[(n + 1) / 2]; else med = (v[n / 2] + v[n / 2 + 1]) / 2
            r = int((9 * n + 9) / 10); if (r > n) r = n
            printf "%.0f %.0f %.0f\n", med, v[1], v[r]
        }'
}

# unit_for NS: the unit (ns, us, ms, s) for a duration; in_unit NS UNIT: its value in it.
unit_for() {
    awk -v x="$1" 'BEGIN {
        if (x >= 1e9) print "s"; else if (x >= 1e6) print "ms"; else if (x >= 1e3) print "us"; else print "ns" }'
}
in_unit() {
    awk -v x="$1" -v u="$2" 'BEGIN {
        d = (u == "s") ? 1e9 : (u == "ms") ? 1e6 : (u == "us") ? 1e3 : 1
        y = x / d
        if (y >= 100) printf "%.0f", y; else if (y >= 10) printf "%.1f", y; else printf "%.2f", y }'
}

# cell SHAPE SYS: sets CELL to "median unit (min/p90)" or the status, and
# MED[SYS] to the median in ns (empty when there is none). Globals, not
# output: a $(...) subshell would lose MED.
declare -A MED
CELL=""
cell() {
    local shape=$1 sys=$2 key="$1.$2" med min p90 u
    MED[$sys]=""
    if [ -z "${BIN[$sys]:-}" ]; then
        CELL="missing"
    elif [ -n "${STATUS[$key]:-}" ]; then
        CELL="${STATUS[$key]}"
    elif [ ! -s "$OUT/$key.ns" ]; then
        CELL="no data"
    else
        read -r med min p90 < <(stats "$OUT/$key.ns")
        MED[$sys]=$med
        u=$(unit_for "$med")
        CELL="$(in_unit "$med" "$u") $u ($(in_unit "$min" "$u")/$(in_unit "$p90" "$u"))"
    fi
}

# ratio SHAPE PEER -> jackdaw/peer, or why there is none (after cell calls).
ratio() {
    local shape=$1 peer=$2 js ps
    js=${STATUS[$shape.jackdaw]:-}
    ps=${STATUS[$shape.$peer]:-}
    if [ -n "${MED[jackdaw]}" ] && [ -n "${MED[$peer]}" ]; then
        awk -v a="${MED[jackdaw]}" -v b="${MED[$peer]}" 'BEGIN { printf "%.2f", a / b }'
    elif [ -n "${MED[jackdaw]}" ] && [[ $ps == DNF* ]]; then
        echo "<1 ($peer DNF)"
    elif [[ $js == DNF* ]] && [ -n "${MED[$peer]}" ]; then
        echo "inf (jd DNF)"
    elif [[ $js == DNF* ]] && [[ $ps == DNF* ]]; then
        echo "both DNF"
    else
        echo "n/a"
    fi
}

# track_worst PEER SHAPE RATIO: folds one ratio cell into PEER's worst ratio
# (WORST, WSHAPE); a Jackdaw DNF or failure where the peer finished is kept
# (JD_DNF, JD_BAD) so the worst ratio is never understated.
declare -A WORST WSHAPE JD_DNF JD_BAD
track_worst() {
    local peer=$1 shape=$2 r=$3
    if [[ $r =~ ^[0-9.]+$ ]]; then
        if [ -z "${WORST[$peer]:-}" ] ||
            awk -v a="$r" -v b="${WORST[$peer]}" 'BEGIN { exit !(a > b) }'; then
            WORST[$peer]=$r
            WSHAPE[$peer]=$shape
        fi
    elif [[ $r == inf* ]]; then
        JD_DNF[$peer]="${JD_DNF[$peer]:-} $shape"
    elif [ -n "${BIN[jackdaw]:-}" ] && [ -z "${MED[jackdaw]}" ] && [ -n "${MED[$peer]}" ]; then
        JD_BAD[$peer]="${JD_BAD[$peer]:-} $shape"
    fi
}

# worst_line PEER: "worst ratio vs PEER: X.XX (shape)" or why there is none.
worst_line() {
    local peer=$1 w=${WORST[$1]:-} dnf=${JD_DNF[$1]:-} bad=${JD_BAD[$1]:-}
    if [ -n "$dnf" ]; then
        echo "worst ratio vs $peer: inf (jackdaw DNF on$dnf)"
    elif [ -n "$w" ] && [ -n "$bad" ]; then
        echo "worst ratio vs $peer: $w (${WSHAPE[$peer]}; incomplete: jackdaw failed$bad)"
    elif [ -n "$w" ]; then
        echo "worst ratio vs $peer: $w (${WSHAPE[$peer]})"
    else
        echo "worst ratio vs $peer: n/a (no shape with both jackdaw and $peer medians)"
    fi
}

mib() { awk -v k="$1" 'BEGIN { printf "%.1f MiB", k / 1024 }'; }

# ---- main ---------------------------------------------------------------------

install_toolchains
mkdir -p "$PEERS"
build_tokio
build_go
probe_jackdaw
rm -rf "$OUT"
mkdir -p "$OUT"

for sys in "${SYSTEMS[@]}"; do
    if [ -n "${BIN[$sys]:-}" ]; then
        say "compare: $sys = ${BIN[$sys]}"
    else
        say "compare: $sys ${NOTE[$sys]}"
    fi
done
if [ -z "${BIN[tokio]:-}${BIN[go]:-}${BIN[jackdaw]:-}" ]; then
    say "compare: nothing to run"
    exit 1
fi

for shape in "${SHAPE_LIST[@]}"; do
    iters=$ITERS limit=$LIMIT
    [ "$shape" = skynet ] && iters=$SKYNET_ITERS
    [ "$shape" = spawn_many_remote_busy2 ] && limit=$BUSY2_LIMIT
    for ((r = 1; r <= ROUNDS; r++)); do
        say "compare: $shape round $r/$ROUNDS ($iters iterations each)"
        for sys in "${SYSTEMS[@]}"; do
            [ -n "${BIN[$sys]:-}" ] || continue
            # After a DNF or ERR the program sits out the rest of the shape.
            [ -z "${STATUS[$shape.$sys]:-}" ] || continue
            run_one "$sys" "$shape" "$iters" "$limit"
        done
    done
done

{
    echo "# bench-compare: W=$W workers, $ROUNDS rounds interleaved (jackdaw, tokio, go), $ITERS iterations per round ($SKYNET_ITERS for skynet)$([ "$QUICK" = 1 ] && echo ", QUICK")$([ "$PIN" = 1 ] && echo ", jackdaw workers pinned (PIN=1)")"
    echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) CPUs, $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo); Linux $(uname -r); load average $(cut -d' ' -f1-3 /proc/loadavg)"
    tv=$(compgen -G '/usr/share/cargo/registry/tokio-1.*' | sed 's/.*tokio-//' | sort -V | tail -1 || true)
    gv=""
    if [ -n "$GO" ]; then gv=$("$GO" version | awk '{ print $3 }'); fi
    echo "# jackdaw $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), tokio ${tv:-?}, ${gv:-go ?}; medians (min/p90) per iteration"
    for sys in "${SYSTEMS[@]}"; do
        [ -z "${NOTE[$sys]:-}" ] || echo "# $sys ${NOTE[$sys]}"
    done
    printf '%-24s | %-26s | %-26s | %-26s | %-14s | %-14s\n' \
        shape jackdaw tokio go jackdaw/tokio jackdaw/go
    printf '%s\n' "$(printf '%.0s-' {1..24})-+-$(printf '%.0s-' {1..26})-+-$(printf '%.0s-' {1..26})-+-$(printf '%.0s-' {1..26})-+-$(printf '%.0s-' {1..14})-+-$(printf '%.0s-' {1..14})"
    for shape in "${SHAPE_LIST[@]}"; do
        cell "$shape" jackdaw
        cj=$CELL
        cell "$shape" tokio
        ct=$CELL
        cell "$shape" go
        cg=$CELL
        rt=$(ratio "$shape" tokio)
        rg=$(ratio "$shape" go)
        printf '%-24s | %-26s | %-26s | %-26s | %-14s | %-14s\n' \
            "$shape" "$cj" "$ct" "$cg" "$rt" "$rg"
        track_worst tokio "$shape" "$rt"
        track_worst go "$shape" "$rg"
    done
    line="skynet peak RSS:"
    for sys in "${SYSTEMS[@]}"; do
        if [ -n "${RSS[skynet.$sys]:-}" ]; then
            line="$line $sys $(mib "${RSS[skynet.$sys]}"),"
        else
            line="$line $sys n/a,"
        fi
    done
    echo "${line%,}"
    # The line compare's readers look for comes last.
    worst_line go
    worst_line tokio
} | tee "$OUT/table.txt"

# The same table as Markdown, for README.md and bench/RESULTS.md.
awk -F' *[|] *' '
    { sub(/ +$/, "") }
    /^#/ { sub(/^# /, ""); print $0 "  "; next }
    /^shape / { print ""; print "| " $1 " | " $2 " | " $3 " | " $4 " | " $5 " | " $6 " |"
                print "|---|---|---|---|---|---|"; next }
    /^---/ { next }
    NF == 6 { print "| " $1 " | " $2 " | " $3 " | " $4 " | " $5 " | " $6 " |"; next }
    { if (!tail++) print ""; print $0 "  " }
' "$OUT/table.txt" >"$OUT/table.md"
say "compare: table in $OUT/table.txt and $OUT/table.md"

exit "$ERRORS"
