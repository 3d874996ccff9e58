#!/usr/bin/env bash
# The test command's setup (scripts/test.sh runs it first), after scripts/install.sh:
#   .venv        the dev extras (pytest, ruff, mypy, import-linter, hypothesis, kubernetes-asyncio, ...)
#   picker/extproc/_front.abi3.so  the native ext_proc front (cargo build of native/front), when cargo is there
#   .tools/      Go tools, nginx + njs, buildah, NGF's shim, the Kubernetes control plane (scripts/install-tools.sh)
# Idempotent: a rerun with everything in place takes a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

[ -x .venv/bin/python ] || { echo "install-test: run scripts/install.sh first" >&2; exit 1; }
.venv/bin/pip install -q -c constraints.txt -e '.[dev]'
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
  echo "install-test: no cargo: the ext_proc port will be served by grpc.aio, not the native front" >&2
fi

bash scripts/install-tools.sh
