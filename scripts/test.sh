#!/usr/bin/env bash
# The test command: its setup (scripts/install-test.sh: dev extras, the native front, the test tools), then lint,
# types, import layers and the whole test suite (unit, protocol, e2e with real Envoy, NGF, a real control plane).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test.sh
export PATH="$PWD/.venv/bin:$PWD/.tools/bin:$PATH"
echo "== ruff";  ruff check . && ruff format --check picker tests
echo "== mypy";  mypy
echo "== import layers"; lint-imports
echo "== pytest"
set +e
pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi
exit "$rc"
