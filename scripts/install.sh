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
    # promtool/prometheus (Debian's prometheus package) for the deploy/ tests; as root only
    # (CI). Without them those tests fail with a message; PP1Q_NO_PROMETHEUS=1 skips them.
    if ! command -v promtool >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt_prometheus() {
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus
        }
        { apt_prometheus || { apt-get update -q && apt_prometheus; }; } >/dev/null 2>&1 || true
    fi
else
    pipi -e .
fi
