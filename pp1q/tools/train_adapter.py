"""Fit an exit adapter (pp1q.models.exit_adapter) on text the model writes itself.

Steps, each printing its progress (``pp1q train-adapter`` runs them):
1. generate: the checkpoint samples answers to fixed prompts (torch generator seeded,
   temperature 1, no top-k/top-p), so no data set is downloaded and the text is the
   distribution the drafter will be asked to follow;
2. collect: one teacher-forced forward per batch, hooks keep the residual stream
   after layer k and after the last layer at every generated position;
3. fit: ridge regression, closed form in float64: the affine map from h_k to h_L
   with the least squared error (lambda named below);
4. refine: a few Adam steps on the quantity acceptance is made of, the total
   variation 1 - sum min(p, q) between the final layer's distribution and the
   adapted exit's (each step a fixed minibatch order from the seed);
5. evaluate: teacher-forced acceptance sum min(p, q) on held-out prompts' text
   (prompts never used in training), plain exit vs adapted, at T = 0.7 and 1.0.

Reproducible: the same seed, checkpoint, torch version and thread count give the
same file. On 2 CPU cores the default run (128 prompts x 128 tokens) takes a few
minutes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

RIDGE = 1.0  # a light ridge: the fit has ~16k samples for 577 inputs per output
TEMPERATURES = (0.7, 1.0)  # the ones BENCHMARKS.md reports
TASKS = ("Write a short story about {}.", "Explain {} to a child.",
         "Give three facts about {}.", "Write a poem about {}.",
         "What are the pros and cons of {}?", "Describe {} in detail.",
         "Write a short dialogue about {}.", "Summarize the history of {}.")
TOPICS = ("the ocean", "a robot", "coffee", "mountains", "the moon", "trains", "music",
          "friendship", "volcanoes", "chess", "bread", "rain", "a library", "bees",
          "winter", "computers")
HELD_OUT = ("Tell me how to plant tomatoes.", "Why do cats purr?",
            "Write a letter to a friend about a trip to Japan.",
            "What should I know before buying a used car?",
            "Explain what an API is.", "Write a haiku about autumn leaves.",
            "How does a refrigerator keep food cold?", "Plan a birthday party for a child.")


def training_prompts() -> list[str]:
    return [task.format(topic) for topic in TOPICS for task in TASKS]


@dataclass
class Text:
    """Token ids of one prompt + the model's answer; ``start``: the first answer id."""

    ids: list[int]
    start: int


def generate(model, tokenizer, prompts: Sequence[str], new_tokens: int, *, seed: int,
             batch: int = 32, say: Callable[[str], None] = print) -> list[Text]:
    """Sample ``new_tokens`` after each chat-templated prompt (stops early at EOS)."""
    from pp1q.models.text import TextCodec

    codec = TextCodec(tokenizer)
    gen = torch.Generator().manual_seed(seed)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    out: list[Text] = []
    t0 = time.perf_counter()
    for lo in range(0, len(prompts), batch):
        encoded = [codec.encode(p, chat=True) for p in prompts[lo: lo + batch]]
        out += _sample(model, encoded, new_tokens, gen, eos, pad)
        say(f"  generated {len(out)}/{len(prompts)} answers "
            f"({time.perf_counter() - t0:.0f} s)")
    return out


@torch.inference_mode()
def _sample(model, prompts: list[list[int]], new_tokens: int, gen, eos, pad) -> list[Text]:
    """Plain ancestral sampling with a left-padded batch and one DynamicCache."""
    from pp1q.models.hf import CausalLM

    lm = CausalLM(model)  # the cache keyword of this transformers version
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    answers: list[list[int]] = [[] for _ in prompts]
    done = torch.zeros(len(prompts), dtype=torch.bool)
    cache = lm.new_cache()
    feed = ids
    for _ in range(new_tokens):
        pos = (mask.cumsum(1) - 1).clamp(min=0)[:, -feed.shape[1]:]
        logits = lm.forward(feed, cache, attention_mask=mask.to(lm.device),
                            position_ids=pos.to(lm.device), last=1)[:, -1].cpu()
        nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)[:, 0]
        for b, t in enumerate(nxt.tolist()):
            if not done[b]:
                answers[b].append(t)
        done |= nxt == eos
        if bool(done.all()):
            break
        feed = nxt[:, None]
        mask = torch.cat([mask, torch.ones(len(prompts), 1, dtype=mask.dtype)], 1)
    return [Text(p + a, len(p)) for p, a in zip(prompts, answers, strict=True)]


def decoder(model):
    from pp1q.models.hf_drafter import _decoder

    return _decoder(model)


@torch.inference_mode()
def collect(model, texts: Sequence[Text], exits: Sequence[int], *, batch: int = 16,
            say: Callable[[str], None] = print) -> dict[int, torch.Tensor]:
    """Residual stream float32 [N, H] after each layer in ``exits`` and after the last
    layer (key: the layer count), at every position that predicts an answer token."""
    layers = decoder(model).layers
    wanted = sorted({*exits, len(layers)})
    caught: dict[int, torch.Tensor] = {}

    def keep(i):
        def hook(_module, _args, output):
            caught[i] = (output[0] if isinstance(output, tuple) else output).float()
        return hook

    handles = [layers[i - 1].register_forward_hook(keep(i)) for i in wanted]
    rows: dict[int, list[torch.Tensor]] = {i: [] for i in wanted}
    try:
        for lo in range(0, len(texts), batch):
            part = texts[lo: lo + batch]
            width = max(len(t.ids) for t in part)
            ids = torch.tensor([t.ids + [0] * (width - len(t.ids)) for t in part])
            mask = torch.tensor([[1] * len(t.ids) + [0] * (width - len(t.ids)) for t in part])
            model(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                  use_cache=False, logits_to_keep=1)
            for b, t in enumerate(part):
                answer = slice(t.start - 1, len(t.ids) - 1)  # row i predicts token i + 1
                for i in wanted:
                    rows[i].append(caught[i][b, answer].cpu())
            say(f"  hidden states of {min(lo + batch, len(texts))}/{len(texts)} texts")
    finally:
        for h in handles:
            h.remove()
    return {i: torch.cat(r) for i, r in rows.items()}


def fit_affine(x: torch.Tensor, y: torch.Tensor, ridge: float = RIDGE):
    """(weight [H, H], bias [H]) minimising |x W^T + b - y|^2 + ridge |W|^2, in float64."""
    x1 = torch.cat([x.double(), torch.ones(len(x), 1, dtype=torch.float64)], 1)
    gram = x1.T @ x1
    gram[:-1, :-1] += ridge * torch.eye(x.shape[1], dtype=torch.float64)  # bias unpenalised
    solution = torch.linalg.solve(gram, x1.T @ y.double())  # [H + 1, H]
    return solution[:-1].T.float().contiguous(), solution[-1].float().contiguous()


def head_of(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """Final norm then LM head: hidden [N, H] -> float32 logits [N, V]."""
    norm, lm_head = decoder(model).norm, model.get_output_embeddings()
    return lambda h: lm_head(norm(h.to(lm_head.weight.dtype))).float()


def acceptance(head, hq: torch.Tensor, hp: torch.Tensor, temperature: float,
               chunk: int = 256) -> float:
    """Mean sum min(p, q) over rows: the expected acceptance of one draft position."""
    total = 0.0
    with torch.inference_mode():
        for lo in range(0, len(hq), chunk):
            p = torch.softmax(head(hp[lo: lo + chunk]) / temperature, -1)
            q = torch.softmax(head(hq[lo: lo + chunk]) / temperature, -1)
            total += float(torch.minimum(p, q).sum())
    return total / max(len(hq), 1)


def refine(head, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
           *, steps: int, seed: int, lr: float = 1e-4, minibatch: int = 256,
           say: Callable[[str], None] = print):
    """Adam on the mean total variation at T = 1, from the ridge fit."""
    if steps <= 0:
        return weight, bias
    gen = torch.Generator().manual_seed(seed)
    w = weight.clone().requires_grad_(True)
    b = bias.clone().requires_grad_(True)
    opt = torch.optim.Adam([w, b], lr=lr)
    t0 = time.perf_counter()
    for step in range(steps):
        rows = torch.randint(len(x), (minibatch,), generator=gen)
        with torch.no_grad():
            p = torch.softmax(head(y[rows]), -1)
        q = torch.softmax(head(x[rows] @ w.T + b), -1)
        loss = 1.0 - torch.minimum(p, q).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0 or step == steps - 1:
            say(f"  refine step {step + 1}/{steps}: 1 - acceptance {loss.item():.3f} "
                f"({time.perf_counter() - t0:.0f} s)")
    return w.detach().contiguous(), b.detach().contiguous()


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the fitted map (recorded in the adapter file)."""

    prompts: int = len(TASKS) * len(TOPICS)
    held_out: int = len(HELD_OUT)  # evaluation prompts, never trained on
    tokens: int = 128
    seed: int = 1
    ridge: float = RIDGE
    refine_steps: int = 100
    refine_lr: float = 1e-4


@dataclass
class Fitted:
    k: int
    path: object  # Path of the written file
    plain: dict[float, float]  # held-out acceptance per temperature, plain exit
    adapted: dict[float, float]  # same, with the map


def adapter_name(ckpt, k: int) -> str:
    return f"{ckpt.path.stem}-exit{k}.safetensors"


def train(ckpt, exits: Sequence[int], out_dir, recipe: Recipe = Recipe(), *,
          say: Callable[[str], None] = print) -> list[Fitted]:
    """Generate, collect, fit and refine one map per exit; write them to ``out_dir``."""
    from pathlib import Path

    from pp1q.models.exit_adapter import ExitAdapter
    from pp1q.models.hf_drafter import num_layers
    from pp1q.runtime.files import check_output

    model, tokenizer = ckpt.model, ckpt.tokenizer
    total = num_layers(model)
    bad = [k for k in exits if not 1 <= k < total]
    if bad:
        raise ValueError(f"exits {bad}: an adapter maps layer k < {total} to the last layer")
    paths = {k: Path(out_dir) / adapter_name(ckpt, k) for k in exits}
    for path in paths.values():  # a folder or FIFO in the way fails now, not after training
        path.parent.mkdir(parents=True, exist_ok=True)
        check_output(path)
    torch.manual_seed(recipe.seed)
    say(f"generating training text: {recipe.prompts} prompts x {recipe.tokens} tokens")
    texts = generate(model, tokenizer, training_prompts()[: recipe.prompts], recipe.tokens,
                     seed=recipe.seed, say=say)
    say(f"generating held-out text: {recipe.held_out} other prompts")
    held = generate(model, tokenizer, HELD_OUT[: recipe.held_out], recipe.tokens,
                    seed=recipe.seed + 1, say=say)
    say("collecting hidden states")
    train_h = collect(model, texts, exits, say=say)
    held_h = collect(model, held, exits, say=say)
    head = head_of(model)
    out = []
    for k in exits:
        x, y = train_h[k], train_h[total]
        say(f"exit {k}: ridge fit on {len(x)} positions")
        weight, bias = fit_affine(x, y, recipe.ridge)
        weight, bias = refine(head, x, y, weight, bias, steps=recipe.refine_steps,
                              seed=recipe.seed + k, lr=recipe.refine_lr, say=say)
        xt, yt = held_h[k], held_h[total]
        plain = {t: acceptance(head, xt, yt, t) for t in TEMPERATURES}
        adapted = {t: acceptance(head, xt @ weight.T + bias, yt, t) for t in TEMPERATURES}
        training = {**recipe.__dict__, "positions": len(x), "held_out_positions": len(xt),
                    "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "held_out_acceptance": {str(t): [round(plain[t], 4), round(adapted[t], 4)]
                                            for t in TEMPERATURES}}
        path = paths[k]
        ExitAdapter(weight, bias, ckpt.identity, k, total, training).save(path)
        say(f"exit {k}: held-out acceptance " + ", ".join(
            f"T={t}: {plain[t]:.1%} -> {adapted[t]:.1%}" for t in TEMPERATURES) + f"; {path}")
        out.append(Fitted(k, path, plain, adapted))
    return out
