#!/usr/bin/env bash
# The test command: lint, types, import layers, then the whole test suite (unit, protocol, e2e with real Envoy).
set -euo pipefail
cd "$(dirname "$0")/.."
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
