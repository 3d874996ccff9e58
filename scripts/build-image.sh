#!/usr/bin/env bash
# Builds picker's container image from the Dockerfile with buildah (daemonless, Debian's package), as root:
#   bash scripts/build-image.sh            # -> localhost/picker:dev in picker's own buildah storage
#   PICKER_IMAGE_ARCHIVE=picker.tar bash scripts/build-image.sh   # also write a docker-archive to load elsewhere
#
# The Dockerfile's base, python:3.11-slim-bookworm, comes from Docker Hub, which this project's machines can't
# reach. So the base is made from Debian's own packages: mmdebstrap (bookworm, minbase + python3.11, venv,
# python-is-python3, ca-certificates) into a tarball, committed as localhost/picker-base:bookworm-py311 and passed
# as the Dockerfile's PYTHON_IMAGE. Everything else is the Dockerfile unchanged. The host's CA bundle is mounted
# over the build's during RUN steps only (pip must trust the same TLS roots as this machine; the image keeps
# Debian's bundle).
#
# Cached between runs under $PICKER_IMAGE_CACHE (default ~/.cache/picker-image): the base tarball (remade when
# its package list changes) and buildah's storage with --layers, so an unchanged dependency layer is reused.
# Storage driver: overlay (PICKER_IMAGE_STORAGE_DRIVER=vfs where the kernel can't mount overlayfs; vfs copies the
# whole filesystem for every layer: minutes and gigabytes).
# Needs: buildah, mmdebstrap (scripts/install-tools.sh installs them), root (chroot isolation).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${PICKER_IMAGE_CACHE:-${HOME:-/root}/.cache/picker-image}
IMAGE=${PICKER_IMAGE:-localhost/picker:dev}
DRIVER=${PICKER_IMAGE_STORAGE_DRIVER:-overlay}
BASE_PACKAGES="python3.11,python3.11-venv,python-is-python3,ca-certificates"
BASE_TAG=localhost/picker-base:bookworm-py311-$(echo "$BASE_PACKAGES" | sha256sum | cut -c1-12)
mkdir -p "$CACHE"

for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "build-image: $tool is needed (scripts/install-tools.sh installs it)" >&2; exit 1; }
done
[ "$(id -u)" -eq 0 ] || { echo "build-image: run as root (buildah with chroot isolation)" >&2; exit 1; }

buildah() { command buildah --storage-driver "$DRIVER" --root "$CACHE/storage-$DRIVER" --runroot "$CACHE/run" "$@"; }

if ! buildah inspect --type image "$BASE_TAG" >/dev/null 2>&1; then
  ROOTFS=$CACHE/bookworm-py311.tar
  echo "build-image: mmdebstrap bookworm ($BASE_PACKAGES)"
  mmdebstrap --quiet --mode=root --variant=minbase --include="$BASE_PACKAGES" \
    --aptopt='Acquire::Retries "3"' bookworm "$ROOTFS" http://deb.debian.org/debian
  ctr=$(buildah from scratch)
  buildah add "$ctr" "$ROOTFS" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash "$ctr"
  buildah commit --quiet --rm "$ctr" "$BASE_TAG" >/dev/null
  rm -f "$ROOTFS"
fi

CA=/etc/ssl/certs/ca-certificates.crt
VOLUMES=()
[ -f "$CA" ] && VOLUMES=(--volume "$CA:$CA:ro")
REVISION=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "build-image: buildah bud -> $IMAGE (base $BASE_TAG)"
buildah bud --quiet --layers --isolation chroot --network host "${VOLUMES[@]}" \
  --build-arg PYTHON_IMAGE="$BASE_TAG" --build-arg REVISION="$REVISION" -t "$IMAGE" . >/dev/null
if [ -n "${PICKER_IMAGE_ARCHIVE:-}" ]; then
  buildah push --quiet "$IMAGE" "docker-archive:$PICKER_IMAGE_ARCHIVE:$IMAGE" >/dev/null
  echo "build-image: wrote $PICKER_IMAGE_ARCHIVE"
fi
buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$IMAGE"
