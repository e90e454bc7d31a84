"""One process-wide choice between compiled (numba) kernels and a plain path that makes
the same decisions, read from an environment variable on first use: ``PP1Q_VALIDATE``
(q-row checks: pp1q.core.q_backend) and ``PP1Q_DECIDE`` (the CPU decision:
pp1q_kernels.numba_rows). One rule for both, so the two variables read alike:

- ``auto`` (default, also when unset or empty): numba when it imports and its kernels
  load, else the plain path, and ``why`` says which and why (the daemons log it);
- ``numba``: numba, or a ConfigError naming the variable (never quietly the plain path);
- the plain path's name (``numpy``, ``torch``): that path.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable

from pp1q.core.errors import ConfigError

Chosen = tuple[str, str, object]  # (backend name, why, the kernels module or None)


class BackendChoice:
    def __init__(self, env: str, plain: str, load: Callable[[], object]) -> None:
        """``load()`` imports the numba kernels (it may raise anything: a broken llvmlite)."""
        self.env, self.plain, self.load = env, plain, load
        self.choices = ("auto", "numba", plain)
        self._chosen: Chosen | None = None

    def choose(self, want: str) -> Chosen:
        """What ``want`` gives in this process (nothing is remembered)."""
        env = self.env
        if want not in self.choices:
            raise ConfigError(f"{env}={want!r}: must be one of {', '.join(self.choices)}", env)
        if want == self.plain:
            return self.plain, f"{env}={want}", None
        if importlib.util.find_spec("numba") is None:
            if want == "numba":
                raise ConfigError(f"{env}=numba but numba is not installed "
                                  "(pip install 'pp1q[fast]')", env)
            return self.plain, "numba not installed", None
        try:
            prefer_wide_vectors()
            kernels = self.load()
        except Exception as e:  # any failure to load the kernels
            if want == "numba":
                raise ConfigError(f"{env}=numba but numba failed to load: {e}", env) from e
            return self.plain, f"numba failed to load: {type(e).__name__}", None
        return "numba", f"{env}={want}", kernels

    def chosen(self) -> Chosen:
        """The process's choice, made from the variable on the first call."""
        if self._chosen is None:
            self._chosen = self.choose(os.environ.get(self.env, "auto").strip().lower()
                                       or "auto")
        return self._chosen

    def select(self, want: str) -> str:
        """Choose for this process as ``{env}=want`` would (``pp1q bench`` times both
        paths in one run); returns the previous choice's name."""
        before = self.chosen()[0]
        self._chosen = self.choose(want)
        return before


NUMBA_FEATURES_ENV = "NUMBA_CPU_FEATURES"  # numba's own: the CPU features LLVM compiles for


def prefer_wide_vectors() -> None:
    """Before numba is first imported: on a CPU with AVX-512, let LLVM vectorise the
    kernels with 512-bit registers. LLVM tunes recent Intel server cores to prefer 256
    bits (older ones slowed their clock on wide instructions), which left the fused dense
    row check at one entry a cycle: 51-64 us a 129,280-entry row at 256 bits, 29-36 at 512
    (an Intel Xeon, Emerald Rapids). Results are the same at any width: the kernels'
    floating-point operations are exact or not reassociated (no fastmath), their sums
    integers. Nothing changes where numba is already imported, where the user set
    NUMBA_CPU_FEATURES (or NUMBA_CPU_NAME) or without AVX-512; numba caches kernels per
    feature set, so both widths' compiled kernels can sit side by side."""
    if "numba" in sys.modules or NUMBA_FEATURES_ENV in os.environ \
            or "NUMBA_CPU_NAME" in os.environ:
        return
    try:
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        features = llvm.get_host_cpu_features().flatten()
    except Exception:  # noqa: BLE001 - no llvmlite, or no host description: numba's default
        return
    if "+avx512f" in features.split(","):
        os.environ[NUMBA_FEATURES_ENV] = features + ",-prefer-256-bit"
