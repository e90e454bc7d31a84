#!/usr/bin/env bash
# Installs pp1q into the current Python. Usage: scripts/install.sh [test]
# torch: an existing torch (a GPU build, say) is kept. Otherwise torch==2.13.0 is
# installed; on the reference CPU machines that resolves to the CPU wheel on disk.
# Elsewhere, install the torch build you want first (CPU:
#   pip install torch --index-url https://download.pytorch.org/whl/cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
pipi() { "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore "$@"; }
if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
    pipi "torch==2.13.0"
fi
if [ "${1:-}" = "test" ]; then
    pipi -e ".[test]"
else
    pipi -e .
fi
