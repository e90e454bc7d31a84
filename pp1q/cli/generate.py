"""``pp1q generate``: send one request to a running verifier and print the result."""

from __future__ import annotations

import json
import sys

HELP = "generate tokens through a running verifier's HTTP API"


def _ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        import argparse

        raise argparse.ArgumentTypeError(f"{text!r}: need token ids like 1,2,3") from None


def add_arguments(p) -> None:
    from pp1q.tools.client import DEFAULT_URL

    p.add_argument("--url", default=DEFAULT_URL, help=f"verifier HTTP API (default {DEFAULT_URL})")
    p.add_argument("--prompt", type=_ids, required=True, metavar="IDS",
                   help="prompt token ids, e.g. 1,2,3")
    p.add_argument("--max-tokens", type=int, default=16, metavar="N")
    p.add_argument("--seed", type=int, help="request seed (default: the server draws one)")
    p.add_argument("--target-only", action="store_true", help="no speculation (speculative=false)")
    p.add_argument("--greedy", action="store_true", help="temperature 0 (works on v1 sessions)")
    p.add_argument("--top-k", type=int, metavar="K",
                   help="proposal support: sparse top-k, 0 = dense (default: server's)")
    p.add_argument("--draft-temperature", type=float, metavar="T")
    p.add_argument("--json", action="store_true", help="print the raw JSON answer")


def run(args) -> int:
    from pp1q.tools.client import ApiError, Client

    options: dict = {"speculative": not args.target_only}
    if args.seed is not None:
        options["seed"] = args.seed
    if args.greedy:
        options["temperature"] = 0
    if args.top_k is not None:
        options["top_k"] = None if args.top_k == 0 else args.top_k
    if args.draft_temperature is not None:
        options["draft_temperature"] = args.draft_temperature
    client = Client(args.url)
    try:
        answer = client.generate(args.prompt, args.max_tokens, **options)
    except ApiError as e:
        print(f"pp1q generate: {e}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if args.json:
        print(json.dumps(answer))
        return 0
    s = answer["stats"]
    print(" ".join(str(t) for t in answer["token_ids"]))
    fallbacks = ", ".join(f"{k}={v}" for k, v in s["fallbacks"].items() if v) or "none"
    print(f"seed {answer['seed']}: {s['rounds']} rounds, {s['accepted']}/{s['drafted']} drafts "
          f"accepted, {s['target_only_steps']} target-only steps, fallbacks: {fallbacks}",
          file=sys.stderr)
    return 0
