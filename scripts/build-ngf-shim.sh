#!/usr/bin/env bash
# Builds NGINX Gateway Fabric's own endpoint-picker shim (`gateway endpoint-picker`) into .tools/bin/ngf-gateway,
# from NGF's upstream files in ../shared/third_party/ngf-epp-shim (read-only; ORIGIN and LICENSE there), with its
# dependencies from the Go module proxy. Called by scripts/install-tools.sh.
#
# Cached by digest: the sha256 of every source file plus the Go version is kept beside the binary; a rerun with the
# same sources skips the build (about a second). A cold build takes about 100 s on 2 cores.
# The source is copied to .tools/build/ngf-epp-shim first: go may need to write go.sum or the build list there.
# PICKER_SHARED_DIR overrides where shared/ is (default: ../shared beside the repository).
set -euo pipefail
cd "$(dirname "$0")/.."

SHARED=${PICKER_SHARED_DIR:-$PWD/../shared}
SRC=$SHARED/third_party/ngf-epp-shim
TOOLS=$PWD/.tools
OUT=$TOOLS/bin/ngf-gateway
STAMP=$OUT.digest

if [ ! -f "$SRC/cmd/gateway/endpoint_picker.go" ] || [ ! -f "$SRC/epp.js" ]; then
  echo "build-ngf-shim: NGF's shim sources are not in $SRC (set PICKER_SHARED_DIR to the shared/ directory)" >&2
  exit 1
fi
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then PATH=$PATH:/usr/local/go/bin; fi
command -v go >/dev/null || { echo "build-ngf-shim: go is needed to build NGF's shim" >&2; exit 1; }

digest=$( (cd "$SRC" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; go version) | sha256sum | cut -d' ' -f1)
if [ -x "$OUT" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$digest" ]; then
  exit 0
fi

echo "build-ngf-shim: go build ./cmd/gateway from $SRC (NGF's endpoint-picker shim; ~100 s cold)"
BUILD=$TOOLS/build/ngf-epp-shim
rm -rf "$BUILD"
mkdir -p "$BUILD" "$TOOLS/bin"
cp -R "$SRC/." "$BUILD/"
chmod -R u+w "$BUILD"
rm -f "$STAMP"
(cd "$BUILD" && GOFLAGS=-buildvcs=false nice -n 10 go build -trimpath -o "$OUT.tmp" ./cmd/gateway)
mv -f "$OUT.tmp" "$OUT"
echo "$digest" > "$STAMP"
rm -rf "$BUILD"
