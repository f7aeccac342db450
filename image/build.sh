#!/usr/bin/env bash
# `make image`: the base (image/base.sh), the image from the Containerfile, then its checks
# (image/check.py). Uses `podman build --isolation=chroot`, which works where `podman run` does not.
#   image/build.sh [IMAGE]       (default localhost/inturn:<version from git, image/version.sh>)
# Env: BASE_IMAGE (localhost/inturn-base:bookworm; any Python 3.11+ image with venv will do),
#      EXTRAS (extras installed with inturn), CA_BUNDLE (trusted for the build's downloads,
#      default /etc/ssl/certs/ca-certificates.crt when it exists).
set -euo pipefail
cd "$(dirname "$0")/.."

# the version the checkout's git history gives (the release tag, or the commit between releases)
VERSION=$(image/version.sh)
IMAGE=${1:-localhost/inturn:${VERSION//+/-}}  # a tag has no "+"
BASE_IMAGE=${BASE_IMAGE:-localhost/inturn-base:bookworm}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

if [[ $BASE_IMAGE == localhost/inturn-base:* ]]; then
    image/base.sh "$BASE_IMAGE"
fi
secret=()
[[ -s $CA_BUNDLE ]] && secret=(--secret "id=ca,src=$CA_BUNDLE")
# what the image is built from, so that a changed source never reuses a cached install layer
SOURCE_DIGEST=$(find pyproject.toml setup.py README.md worker operator -type f \
    -not -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
echo "image $IMAGE: podman build (base $BASE_IMAGE, sources $SOURCE_DIGEST)"
podman build --quiet --isolation=chroot "${secret[@]}" \
    --build-arg "BASE=$BASE_IMAGE" --build-arg "VERSION=$VERSION" \
    --build-arg "SOURCE_DIGEST=$SOURCE_DIGEST" \
    --build-arg "EXTRAS=${EXTRAS:-operator}" -t "$IMAGE" . >/dev/null
python3 image/check.py "$IMAGE" "$VERSION"
