"""``pp1q train-adapter``: fit exit adapters for early-exit drafting (issue 11 item 10).

The shipped maps (pp1q/models/adapters/) come from exactly
``pp1q train-adapter --k 24,28 --out pp1q/models/adapters`` (the defaults below);
BENCHMARKS.md, "Exit adapters", has the run's figures."""

from __future__ import annotations

import os
import sys

# torch's OpenMP workers sleep between ops (as in pp1q bench): spinning workers made
# each sampling step ~10x slower on a shared 2-core machine. Set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HELP = "fit an affine exit adapter per early exit on text the model generates itself"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def add_arguments(p) -> None:
    from pp1q.tools.train_adapter import Recipe

    r = Recipe()
    p.add_argument("--model", default="embedded",
                   help="embedded (SmolLM2-135M, the default) or a local checkpoint path")
    p.add_argument("--k", type=_ints, default=[24, 28], metavar="K,K,...",
                   help="early exits to fit a map for (default 24,28)")
    p.add_argument("--out", default="adapters", help="folder for the files (default ./adapters)")
    p.add_argument("--prompts", type=int, default=r.prompts,
                   help=f"training prompts, of the built-in {r.prompts} (default all)")
    p.add_argument("--tokens", type=int, default=r.tokens, help=f"tokens per answer ({r.tokens})")
    p.add_argument("--seed", type=int, default=r.seed, help=f"sampling and refine seed ({r.seed})")
    p.add_argument("--refine-steps", type=int, default=r.refine_steps,
                   help=f"Adam steps after the ridge fit ({r.refine_steps}; 0: ridge only)")
    p.add_argument("--threads", type=int, default=2,
                   help="torch threads (2; recorded: results depend on it in the last bits)")
    p.add_argument("--gguf-cache", default=None,
                   help="de-quantized GGUF cache folder (default ~/.cache/pp1q)")


def run(args) -> int:
    import torch

    from pp1q.core.errors import ConfigError
    from pp1q.models.hf import load_checkpoint
    from pp1q.models.serving import model_path
    from pp1q.tools.realmodel import default_cache, quiet_progress_bars
    from pp1q.tools.train_adapter import Recipe, train

    torch.set_num_threads(args.threads)
    quiet_progress_bars()
    recipe = Recipe(prompts=args.prompts, tokens=args.tokens, seed=args.seed,
                    refine_steps=args.refine_steps)
    try:
        path = model_path(args.model)
        print(f"loading {path.name}", flush=True)
        ckpt = load_checkpoint(path, gguf_cache=args.gguf_cache or default_cache())
        fitted = train(ckpt, args.k, args.out, recipe,
                       say=lambda line: print(line, flush=True))
    except (ConfigError, ValueError, FileNotFoundError, ImportError) as e:
        print(f"pp1q train-adapter: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # --out not a folder, an adapter file a FIFO (files.check_output)
        where = f"{e.filename}: " if e.filename else ""  # ENOSPC on a write names none
        print(f"pp1q train-adapter: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    print("\nheld-out acceptance per position (sum min(p, q)), plain exit -> adapted:")
    for f in fitted:
        print(f"  k={f.k}: " + ", ".join(f"T={t}: {f.plain[t]:.1%} -> {f.adapted[t]:.1%}"
                                         for t in f.plain))
    return 0
