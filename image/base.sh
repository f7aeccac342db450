#!/usr/bin/env bash
# The base image, made here without any registry: a Debian minbase root filesystem from
# debootstrap with python3, python3-venv and CA certificates, imported into podman.
#   image/base.sh [IMAGE]        (default localhost/inturn-base:bookworm; kept once made)
# Env: SUITE (bookworm), MIRROR (http://deb.debian.org/debian). Needs root, debootstrap, podman.
set -euo pipefail

BASE=${1:-localhost/inturn-base:bookworm}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

if podman image exists "$BASE"; then
    echo "base image $BASE: already here"
    exit 0
fi
for tool in debootstrap podman; do
    command -v "$tool" >/dev/null || { echo "base.sh: $tool is missing (apt-get install $tool)" >&2; exit 1; }
done

root=$(mktemp -d /var/tmp/inturn-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "base image $BASE: debootstrap $SUITE (minbase + python3, python3-venv), a few minutes"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
rm -f "$root.log"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
    "$root"/usr/share/man/* "$root"/usr/share/locale/*
tar --numeric-owner -C "$root" -c . | podman import --quiet --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
echo "base image $BASE: imported ($(podman image inspect --format '{{.Size}}' "$BASE") bytes)"
