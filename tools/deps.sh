#!/usr/bin/env bash
# Install the Debian packages named as arguments that are not installed yet:
# with apt-get as root, with sudo otherwise, or say which command to run.
set -euo pipefail
missing=()
for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}" >&2
if [ "$(id -u)" = 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    echo "deps: missing packages and no root: run  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 ||
    { "${SUDO[@]}" apt-get update -q >&2 && \
      "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; }
