"""``pp1q generate``: send one request to a running verifier and print its tokens as they
are committed (a streamed /v1/completions)."""

from __future__ import annotations

import json
import sys

HELP = "generate tokens through a running verifier's HTTP API (streamed as committed)"


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
    p.add_argument("--stop-token", type=int, action="append", metavar="ID",
                   help="end the output at this token id (repeatable; not printed)")
    p.add_argument("--json", action="store_true",
                   help="print each streamed event's JSON, one a line")


def run(args) -> int:
    from pp1q.tools.client import ApiError, Client

    ext: dict = {"speculative": not args.target_only}
    body: dict = {"pp1q": ext}
    if args.seed is not None:
        body["seed"] = args.seed
    if args.greedy:
        body["temperature"] = 0
    if args.top_k is not None:
        ext["draft_top_k"] = None if args.top_k == 0 else args.top_k
    if args.draft_temperature is not None:
        ext["draft_temperature"] = args.draft_temperature
    if args.stop_token:
        body["stop_token_ids"] = args.stop_token
    client = Client(args.url)
    last: dict = {}
    try:
        first = True
        for event in client.stream(args.prompt, args.max_tokens, **body):
            last = event
            if args.json:
                print(json.dumps(event), flush=True)
                continue
            ids = event["choices"][0]["token_ids"]
            if ids:
                print(("" if first else " ") + " ".join(map(str, ids)), end="", flush=True)
                first = False
    except ApiError as e:
        if not args.json and not first:
            print()
        where = "" if e.status == 0 else f"{args.url}: "  # unreachable names it already
        print(f"pp1q generate: {where}{e}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if args.json:
        return 0
    print()
    ext_out = last.get("pp1q", {})
    s = ext_out.get("stats", {})
    fallbacks = ", ".join(f"{k}={v}" for k, v in s.get("fallbacks", {}).items() if v) or "none"
    print(f"seed {ext_out.get('seed')}: {s.get('rounds')} rounds, {s.get('accepted')}/"
          f"{s.get('drafted')} drafts accepted, {s.get('target_only_steps')} target-only "
          f"steps, fallbacks: {fallbacks}; finish: "
          f"{last.get('choices', [{}])[0].get('finish_reason')}", file=sys.stderr)
    return 0
