#!/usr/bin/env bash
# Prepares, on a machine with PyPI and pp1q installed (scripts/install.sh), what a lent GPU
# machine lacks for scripts/device_check.sh: that machine reaches no registry, runs its
# image's Python 3.12 with torch, Triton, numba and transformers already there, and takes
# at most 64 MiB a call (the working tree included). Writes .device/ (git ignores it):
#   .device/whl/    pp1q itself as a wheel, and the wheels the image lacks (msgspec, gguf,
#                   pytest-asyncio), each at the version installed here
#   .device/model1/ .device/model2/   the embedded SmolLM2 GGUF (98 MB) in two halves, one
#                   a call; .device/model1/SHA256 is the whole file's digest
# The two calls that use it (docs/kernels.md, "GPU status"; scripts/device_env.sh puts
# them together there):
#   1. carry .device/whl and .device/model1:
#      source scripts/device_env.sh && bash scripts/device_check.sh "$OUT/dc" triton bench-kernels engine-device
#   2. at once, while the machine is warm (it keeps /tmp about 30 s after a call), carry
#      .device/model2:
#      source scripts/device_env.sh && bash scripts/device_check.sh "$OUT/dc" bench-profile shard-cuda
# A second call that finds the machine bare says so and stops (status 1): the recovery is
# two calls more (.device/whl and .device/model1, then .device/model2 and call 2's steps).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=.device
LIMIT=$((64 * 1024 * 1024))  # the device tool's bytes a call, the working tree included
rm -rf "$OUT"
mkdir -p "$OUT/whl" "$OUT/model1" "$OUT/model2"
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
echo "device_bundle: pp1q as a wheel"
had_build=$([ -d build ] && echo yes || true)
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT/whl" . >/dev/null
[ -n "$had_build" ] || rm -rf build  # setuptools' own leftovers, not a build of yours
for name in msgspec gguf pytest-asyncio; do
    spec="$name==$(version "$name")"
    echo "device_bundle: $spec for CPython 3.12, manylinux x86_64"
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$OUT/whl" "$spec"
done
gguf=$("$PY" -c 'from pp1q.models.embedded import smollm2_gguf; print(smollm2_gguf())')
size=$(stat -c %s "$gguf")
half=$(( (size + 1) / 2 ))
echo "device_bundle: $(basename "$gguf") ($size bytes) in two halves"
head -c "$half" "$gguf" > "$OUT/model1/part"
tail -c +"$((half + 1))" "$gguf" > "$OUT/model2/part"
basename "$gguf" > "$OUT/model1/NAME"
sha256sum < "$gguf" | cut -d' ' -f1 > "$OUT/model1/SHA256"
cat "$OUT/model1/part" "$OUT/model2/part" | cmp -s - "$gguf" || {
    echo "device_bundle: the halves do not make the file" >&2; exit 1; }
# the working tree as the device tool sends it: tracked files and those git does not ignore
tree=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } \
    | { du -cb --files0-from=- 2>/dev/null || true; } | tail -1 | cut -f1)  # none deleted
for call in "whl model1" "model2"; do
    bytes=$tree
    for part in $call; do bytes=$((bytes + $(du -sb "$OUT/$part" | cut -f1))); done
    echo "device_bundle: a call carrying $call sends about $((bytes / 1048576)) MiB (of 64)"
    if [ "$bytes" -gt "$LIMIT" ]; then echo "device_bundle: over the limit" >&2; exit 1; fi
done
echo "device_bundle: done ($OUT)"
