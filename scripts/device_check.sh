#!/usr/bin/env bash
# The checks only a GPU machine can make, in one bounded run (CI has no GPU: everything
# else passes on CPU, Triton under TRITON_INTERPRET=1). Usage, on a machine with CUDA and
# pp1q installed (scripts/install.sh keeps its CUDA torch; on a lent machine that reaches
# no registry, scripts/device_bundle.sh here and scripts/device_env.sh there):
#   bash scripts/device_check.sh [OUT_DIR [STEP...]]
# Each step's output goes to OUT_DIR (default ./device-check); a failed step does not
# stop the others; the summary says which failed. STEPs (names below) run only those.
# Bounds: steps 1-3 at most 6 min together, steps 4-5 at most 5 (a device call: 10 min);
# on a lent machine (no registry, 64 MiB a call) they are two calls, 1-3 then 4-5, the
# second carrying the model's other half (scripts/device_bundle.sh), the goal's step first.
#   1. the Triton kernels compiled on CUDA tensors, bit for bit against the torch path
#   2. pp1q bench kernels (the kernels on CUDA against their baselines, one run; and a
#      real target's rounds decided on the device against p copied to the host)
#   3. a real model's decider on its target's device: rounds decided on CUDA against the
#      CPU kernel's decisions on the same rows; the worker's logits staged in pinned memory
#   4. pp1q bench profile --quick: issue 13's real-model goal (the verifier's work other
#      than the forward <= 10% of it) with the embedded model on CUDA, where the forward
#      is far shorter than on a CPU (needs the embedded model: scripts/install.sh; a
#      skip is reported as a failure, since nothing was measured); read the goal's
#      figures from device-check/bench-profile.log
#   5. the sharded sampler's device path: 3 ranks over gloo with the collectives' tensors
#      on cuda, decisions against one rank's (NCCL itself needs a GPU per rank)
set -u
cd "$(dirname "$0")/.."
OUT=${1:-device-check}
shift || true
only=" $* "  # the steps asked for; none: every step
for name in "$@"; do
    case " triton bench-kernels engine-device bench-profile shard-cuda " in
        *" $name "*) ;;
        *) echo "device_check: no step named $name"; exit 2 ;;
    esac
done
mkdir -p "$OUT"
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || {
    echo "device_check: no CUDA device here"; exit 2; }
failed=()
# the pytest steps run one process; a test that hangs prints its stack and fails before
# the step's bound kills pytest
# (pytest-timeout: in the GPU image, and wherever it is installed; else no such stack)
pytest=(python3 -m pytest -q -p no:cacheprovider -n 0)
if python3 -c 'import pytest_timeout' 2>/dev/null; then pytest+=(--timeout 60); fi
step() {  # step NAME TIMEOUT_S COMMAND...
    local name=$1 limit=$2; shift 2
    if [ "$only" != "  " ] && [[ "$only" != *" $name "* ]]; then return; fi
    echo "device_check: $name ..."
    if timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; then echo "  ok"
    else echo "  FAILED (status $?; $OUT/$name.log)"; failed+=("$name"); fi
}
step triton 150 "${pytest[@]}" tests/kernels/test_kernels_triton.py
step bench-kernels 120 pp1q bench kernels
step engine-device 90 "${pytest[@]}" tests/verifier/test_engine_device.py \
    tests/models/test_host_staging.py
step bench-profile 180 pp1q bench profile --quick
# the suite exits 0 when it skips (no real-model extra): that is not a measurement
if [ "$only" = "  " ] || [[ "$only" == *" bench-profile "* ]] \
        && grep -q '^skipped' "$OUT/bench-profile.log" 2>/dev/null; then
    echo "  not measured, counted as failed: $(grep -m1 '^skipped' "$OUT/bench-profile.log")"
    [[ " ${failed[*]-} " == *" bench-profile "* ]] || failed+=("bench-profile")
fi
step shard-cuda 120 env PP1Q_TEST_DEVICE=cuda "${pytest[@]}" \
    tests/verifier/ranks/test_ranks_shard_gloo.py
if [ ${#failed[@]} -eq 0 ]; then echo "device_check: every step passed"; exit 0; fi
echo "device_check: failed: ${failed[*]}"; exit 1
