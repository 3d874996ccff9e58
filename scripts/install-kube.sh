#!/usr/bin/env bash
# Builds the local Kubernetes control plane the `kube` tests run against (tests/cluster/), from the Go module proxy:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl   Kubernetes v1.34.4
#   etcd                                                              v3.6.4
#   kwok (fake nodes: pods go Running without a kubelet)               v0.7.0
# The binaries are cached by version outside the checkout, in ${XDG_CACHE_HOME:-~/.cache}/picker-tools/NAME-VERSION/,
# and linked into .tools/bin, so another clone on the same machine (CI) reuses them: a warm run takes well under a
# second, a cold build about 22 minutes on 2 busy cores (niced), a rebuild with a warm Go build cache 44 s.
# `PICKER_KUBE_CACHE` overrides the cache folder.
set -euo pipefail
cd "$(dirname "$0")/.."

KUBE_VERSION=v1.34.4
ETCD_VERSION=v3.6.4
KWOK_VERSION=v0.7.0

BIN=$PWD/.tools/bin
CACHE=${PICKER_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/picker-tools}
mkdir -p "$BIN" "$CACHE"
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then PATH=$PATH:/usr/local/go/bin; fi
export GOFLAGS=-buildvcs=false

# One build at a time per machine: two clones (a developer's and CI's) may run this together.
exec 9>"$CACHE/.lock"
flock 9

# Each part is built into NAME-VERSION.tmp and renamed when complete, so a cache folder is either whole or absent.
built() { [ -f "$CACHE/$1/.complete" ]; }
finish() { touch "$CACHE/$1.tmp/.complete"; rm -rf "${CACHE:?}/$1"; mv "$CACHE/$1.tmp" "$CACHE/$1"; }
# begin PART WHAT: false when PART is cached already; else an empty $CACHE/PART.tmp with src/ and bin/.
begin() {
  built "$1" && return 1
  command -v go >/dev/null || { echo "install-kube: go is needed to build $2" >&2; exit 1; }
  echo "install-kube: building $2"
  rm -rf "$CACHE/$1.tmp"; mkdir -p "$CACHE/$1.tmp/src" "$CACHE/$1.tmp/bin"
}

build_kube() {
  local part=kube-$KUBE_VERSION out=$CACHE/kube-$KUBE_VERSION.tmp mod staging
  begin "$part" "Kubernetes $KUBE_VERSION (cold: ~15-20 min on 2 cores)" || return 0
  # k8s.io/kubernetes replaces its staging modules (k8s.io/api, k8s.io/client-go, ...) with ./staging/src/...,
  # which its published module does not hold: a wrapper module replaces each by its published v0.x version.
  (cd "$out/src" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" >/dev/null)
  mod=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$KUBE_VERSION.mod
  staging=v0.${KUBE_VERSION#v1.}
  {
    echo "module picker.local/kube-tools"
    echo
    echo "go 1.24"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    grep -E '=> \./staging/' "$mod" | awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}'
  } >"$out/src/go.mod"
  cat >"$out/src/tools.go" <<'EOF'
//go:build tools

// Package tools pins the Kubernetes commands this module builds.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
EOF
  (cd "$out/src" && go mod tidy)
  # Without the version stamp the binaries call themselves v0.0.0-master and kubectl/helm fail to parse it.
  local minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
  local ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    echo "install-kube: go build $cmd"
    (cd "$out/src" && nice -n 10 go build -trimpath -ldflags "$ld" -o "$out/bin/$cmd" "k8s.io/kubernetes/cmd/$cmd")
  done
  finish "$part"
}

build_etcd() {
  local part=etcd-$ETCD_VERSION out=$CACHE/etcd-$ETCD_VERSION.tmp
  begin "$part" "etcd $ETCD_VERSION" || return 0
  printf 'module picker.local/etcd-tools\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" \
    >"$out/src/go.mod"
  printf '//go:build tools\n\n// Package tools pins the etcd server.\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' \
    >"$out/src/tools.go"
  (cd "$out/src" && go mod tidy)
  (cd "$out/src" && nice -n 10 go build -trimpath -ldflags "-s -w" -o "$out/bin/etcd" go.etcd.io/etcd/server/v3)
  finish "$part"
}

build_kwok() {
  local part=kwok-$KWOK_VERSION out=$CACHE/kwok-$KWOK_VERSION.tmp
  begin "$part" "kwok $KWOK_VERSION" || return 0
  GOBIN=$out/bin nice -n 10 go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  finish "$part"
}

start=$SECONDS
build_etcd
build_kwok
build_kube
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  ln -sfn "$CACHE/kube-$KUBE_VERSION/bin/$cmd" "$BIN/$cmd"
done
ln -sfn "$CACHE/etcd-$ETCD_VERSION/bin/etcd" "$BIN/etcd"
ln -sfn "$CACHE/kwok-$KWOK_VERSION/bin/kwok" "$BIN/kwok"
echo "install-kube: Kubernetes $KUBE_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION in .tools/bin ($((SECONDS - start)) s)"
