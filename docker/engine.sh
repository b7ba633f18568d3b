# shellcheck shell=bash disable=SC2034
# docker/engine.sh: what docker/smoke.sh and docker/cluster_smoke.sh share
# (sourced, from the repository root): TAP helpers, the container engine
# and the Debian base image.
#
# Engine: docker when a daemon answers, otherwise podman with the runc
# runtime (installed with apt when missing). When the Debian base image
# cannot be pulled (no registry access here), a local base is made offline
# from Debian's packages: `debootstrap --variant=minbase bookworm` into a
# cache folder, imported as localhost/jackdaw-base:bookworm.
#
# Environment: JD_ROOTFS_CACHE (debootstrap cache, default
# /var/tmp/jackdaw-rootfs), JD_DEBIAN_MIRROR (default
# http://deb.debian.org/debian).

LOCAL_BASE=localhost/jackdaw-base:bookworm
CACHE=${JD_ROOTFS_CACHE:-/var/tmp/jackdaw-rootfs}
MIRROR=${JD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
n=0
failures=0

ok() {
    n=$((n + 1))
    echo "ok $n - $1"
}
not_ok() {
    n=$((n + 1))
    failures=$((failures + 1))
    echo "not ok $n - $1"
}
log() { echo "# $*"; }
die() {
    not_ok "$1"
    echo "1..$n"
    exit 1
}

# Sets ENGINE (the command), RUN_OPTS and BUILD_OPTS; extra Debian
# packages the caller needs with podman are named as arguments.
pick_engine() {
    ENGINE=()
    RUN_OPTS=()
    BUILD_OPTS=()
    if command -v docker >/dev/null 2>&1 && timeout 10 docker info >/dev/null 2>&1; then
        ENGINE=(docker)
    else
        tools/deps.sh podman runc debootstrap uidmap iptables "$@"
        ENGINE=(podman --runtime runc)
        BUILD_OPTS=(--format docker)
        RUN_OPTS=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
    fi
    log "engine: ${ENGINE[*]}"
}
E() { "${ENGINE[@]}" "$@"; }

# Sets BASE: Debian's published image, else the local debootstrap one.
base_image() {
    BASE=debian:bookworm-slim
    if E image inspect "$BASE" >/dev/null 2>&1 ||
        timeout 60 "${ENGINE[@]}" pull -q "$BASE" >/dev/null 2>&1; then
        return 0
    fi
    BASE=$LOCAL_BASE
    E image inspect "$BASE" >/dev/null 2>&1 && return 0
    local rootfs="$CACHE/bookworm"
    if [ ! -x "$rootfs/usr/bin/apt-get" ]; then
        log "making a minbase bookworm root with debootstrap in $rootfs (a few minutes)"
        rm -rf "$rootfs"
        mkdir -p "$CACHE"
        debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
            die "debootstrap bookworm (log: $CACHE/debootstrap.log)"
    fi
    # apt inside the image must fetch from the same mirror.
    echo "deb $MIRROR bookworm main" >"$rootfs/etc/apt/sources.list"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | E import - "$BASE" >/dev/null || die "import the local base image"
}

# build IMAGE DOCKERFILE CONTEXT: build on BASE (host network: apt fetches);
# a TAP line with the time it took, the log's tail on failure.
build_image() {
    local image=$1 file=$2 context=$3 blog
    blog=${TMPDIR:-/tmp}/jackdaw-build-${image//[^a-z0-9]/_}.log
    local start
    start=$(date +%s)
    if E build "${BUILD_OPTS[@]}" --network host --build-arg "BASE=$BASE" \
        -f "$file" -t "$image" "$context" >"$blog" 2>&1; then
        ok "$image builds from $file ($(($(date +%s) - start)) s)"
    else
        tail -n 30 "$blog" | sed 's/^/#   /'
        die "$image builds from $file (log: $blog)"
    fi
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
        echo 18080
}
