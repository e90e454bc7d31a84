"""``pp1q replay``: decode a capture like a protocol analyser, or replay it."""

from __future__ import annotations

import json
import sys

HELP = "decode a capture file (--capture) like a protocol analyser, or replay it"

EXIT_DIVERGED = 1  # the replay endpoint refused or re-encoded a captured frame differently
EXIT_BAD_CAPTURE = 2  # corrupt, truncated or unknown capture file (--worker: part-way too)
EXIT_NO_WORKER = 3  # --worker: unreachable, not the wire, refused the session, closed, silent
FOLLOW_POLL_S = 0.2  # --follow: how often to look for appended records


def add_arguments(p) -> None:
    p.add_argument("file", metavar="FILE", help="a capture written by --capture (.pp1qcap)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="a detail line per REPLY and per PROPOSAL position: support size, "
                        "sampled id, its q, checksum, row validity")
    p.add_argument("--verify", action="store_true",
                   help="replay the worker's frames through a fresh in-memory verifier "
                        "endpoint driven by the verifier's frames; print events and commits")
    p.add_argument("--reverify", action="store_true",
                   help="--verify, and decide every validated round again with the target "
                        "named in HELLO (pp1q's toy targets)")
    p.add_argument("--draw-secret-file", metavar="FILE",
                   help="with --reverify: the verifier's draw secret (its draw_secret_file), "
                        "needed when the capture names one (by fingerprint)")
    p.add_argument("--step-timeout", type=float, metavar="S",
                   help="watchdog for --verify (default: step_timeout_s from the capture)")
    p.add_argument("--json", action="store_true",
                   help="machine-readable output: one JSON object per line (analysis) or "
                        "one report object (--verify)")
    p.add_argument("--follow", action="store_true",
                   help="keep reading as the daemon appends (Ctrl-C ends; not with --verify)")
    p.add_argument("--allow-truncated", action="store_true",
                   help="read a capture cut inside its last record (daemon killed mid-write)")
    p.add_argument("--worker", metavar="HOST:PORT",
                   help="send the capture's verifier frames to a live worker daemon (TCP; "
                        "mutual TLS with --tls-*) and compare its answers with the captured "
                        "ones: tokens, q rows, positions, frame kinds, session limits; exit 1 "
                        "on a divergence, 2 when the capture breaks part-way (compared up "
                        "to there), 3 when the worker is unreachable, does not speak the "
                        "wire, refuses the session, closes it early, or is silent")
    p.add_argument("--wait-s", type=float, default=None, metavar="S",
                   help="with --worker: how long to wait for each answer the capture shows "
                        "before the next frame is sent (default 5)")
    # --worker over mutual TLS, as the verifier daemon connects (pp1q.runtime.tls)
    p.add_argument("--tls-cert", dest="tls_cert", metavar="FILE.pem",
                   help="with --worker: a client certificate the worker's --tls-ca signed "
                        "(PEM); with --tls-key and --tls-ca the replay speaks mutual TLS")
    p.add_argument("--tls-key", dest="tls_key", metavar="FILE.pem",
                   help="private key of --tls-cert (PEM)")
    p.add_argument("--tls-ca", dest="tls_ca", metavar="FILE.pem",
                   help="the only CA whose certificate is accepted from the worker (PEM)")
    p.add_argument("--tls-server-name", dest="tls_server_name", metavar="NAME",
                   help="name the worker's certificate must carry (unset: the host of "
                        "--worker)")


def run(args) -> int:
    from pp1q.runtime.capture import CaptureError, CaptureReader

    try:
        reader = CaptureReader(args.file, allow_truncated=args.allow_truncated,
                               follow_s=FOLLOW_POLL_S if args.follow else 0.0)
        if args.follow and (args.verify or args.reverify or args.worker):
            print("pp1q replay: --follow reads as it goes; --verify and --worker need the "
                  "whole capture", file=sys.stderr)
            return 2
        if args.worker is not None:
            return _live(args, reader)
        code = _verify(args, reader) if args.verify or args.reverify else _analyse(args, reader)
    except KeyboardInterrupt:  # --follow ends here
        return 0
    except BrokenPipeError:  # `pp1q replay FILE | head`: the reader has seen enough
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except CaptureError as e:
        sys.stdout.flush()
        print(f"pp1q replay: {args.file}: {e}", file=sys.stderr)
        return EXIT_BAD_CAPTURE
    except OSError as e:
        print(f"pp1q replay: {args.file}: {e.strerror}", file=sys.stderr)
        return EXIT_BAD_CAPTURE
    if reader.truncated is not None:
        print(f"pp1q replay: warning: {reader.truncated}; read up to there", file=sys.stderr)
    return code


def _analyse(args, reader) -> int:
    from pp1q.tools.replay import decode
    from pp1q.tools.replay.analyse import Analyser

    h = reader.header
    if not args.json:
        print(f"# {args.file}: capture v{h.version}, recorded by the {h.role.name.lower()}")
    analyser = Analyser(verbose=args.verbose)
    counts: dict[str, int] = {}
    for item in decode(h.role, reader):
        counts[item.what] = counts.get(item.what, 0) + 1
        if args.json:
            print(json.dumps(_item_json(item)), flush=args.follow)
        else:
            for line in analyser.lines(item):
                print(line, flush=args.follow)
    if not args.json:
        print("# " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    return 0


def _item_json(item) -> dict:
    import msgspec

    out = {"time_ns": item.time_ns, "conn": item.conn, "what": item.what,
           "dir": str(item.flow) if item.flow else None}
    if item.meta:
        out["meta"] = item.meta
    if item.error is not None:
        out["reason"], out["detail"] = item.error.reason.value, item.error.detail
    m = item.message
    if m is not None:
        from pp1q.wire.messages import HEAD_CLASSES, type_of

        # the control part's fields only: a payload's arrays (REPLY and PROPOSAL rows,
        # CONTEXT tokens) are not dumped, their lengths are control fields
        head = HEAD_CLASSES.get(type_of(m))
        fields = (msgspec.structs.asdict(m) if head is None
                  else {f: getattr(m, f) for f in head.__struct_fields__})
        out["type"] = type(m).__name__
        out["fields"] = msgspec.to_builtins(fields)
        if item.frame is not None and item.frame.error is not None:
            out["frame_error"] = item.frame.error.reason.value
    return out


def _verify(args, reader) -> int:
    from pp1q.tools.replay import Reverifier, VerifierReplay
    from pp1q.tools.replay.analyse import describe_event

    reverifier = None
    if args.reverify:
        target = _target_of(reader)
        if target is None:
            print("pp1q replay: --reverify: the HELLO's target is not one pp1q can rebuild",
                  file=sys.stderr)
            return EXIT_BAD_CAPTURE
        from pp1q.core.errors import ConfigError
        from pp1q.runtime.draw_secret import load_draw_keys
        from pp1q.tools.replay.reverify import draws_for
        from pp1q.tools.replay.verifier import draw_key_info

        try:
            secret = args.draw_secret_file
            draws = draws_for(draw_key_info(reader),
                              load_draw_keys(secret) if secret is not None else None)
        except ConfigError as e:
            print(f"pp1q replay: --reverify: {e}", file=sys.stderr)
            return EXIT_BAD_CAPTURE
        reverifier = Reverifier(target, draws)
    report = VerifierReplay(reader.header.role, step_timeout=args.step_timeout,
                            reverifier=reverifier).run(reader)
    if args.json:
        print(json.dumps(_report_json(report), indent=1))
        return 0 if report.ok else EXIT_DIVERGED
    t0 = report.start_ns or 0
    rows = [(h.time_ns, h.conn, describe_event(h.event)) for h in report.events]
    rows += [(c.time_ns, c.conn, f"COMMIT          s{c.slot} g{c.generation} r{c.round_id} "
                                 f"accepted={c.accepted} token={c.token}")
             for c in report.commits]
    rows += [(e.time_ns, e.conn, f"STREAM_ERROR    {e.event}") for e in report.stream_errors]
    rows += [(d.time_ns, d.conn, f"!! DIVERGENCE   {d.what}") for d in report.divergences]
    for t, conn, text in sorted(rows, key=lambda r: r[0]):
        print(f"{(t - t0) / 1e9:11.6f}  c{conn:<3} {text}")
    summary = (f"# {len(report.ready)} proposals ready, {len(report.failures)} failed, "
               f"{len(report.commits)} commits, {len(report.divergences)} divergences")
    if reverifier is not None:
        summary += f", {report.rechecked} commits re-decided"
        if report.not_rechecked:
            summary += f" ({report.not_rechecked} rounds without captured context)"
    print(summary)
    return 0 if report.ok else EXIT_DIVERGED


def _live(args, reader) -> int:
    import asyncio

    from pp1q.core.errors import ConfigError
    from pp1q.runtime import tls
    from pp1q.runtime.settings import TLS_FILES, VerifierSettings, parse_hostport
    from pp1q.tools.replay.live import DEFAULT_WAIT_S, LiveError, replay_live

    wait_s = DEFAULT_WAIT_S if args.wait_s is None else args.wait_s
    if args.verify or args.reverify:
        print("pp1q replay: --worker replays against a live worker; --verify and "
              "--reverify against an in-memory one: one at a time", file=sys.stderr)
        return 2
    if not 0 < wait_s <= 3600:
        print(f"pp1q replay: --wait-s {wait_s:g}: not within (0, 3600] seconds",
              file=sys.stderr)
        return 2
    try:
        host, port = parse_hostport(args.worker, "--worker")
        given = {k: getattr(args, k) for k in (*TLS_FILES, "tls_server_name")}
        client = tls.client_tls(VerifierSettings(**{k: v for k, v in given.items() if v}),
                                host)
        if client is None and given["tls_server_name"]:
            raise ConfigError("--tls-server-name needs --tls-cert, --tls-key and --tls-ca")
    except ConfigError as e:
        print(f"pp1q replay: {e}", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(replay_live(reader.header.role, reader, host, port,
                                         wait_s=wait_s, tls=client))
    except LiveError as e:
        sys.stdout.flush()
        print(f"pp1q replay: {e}", file=sys.stderr)
        return EXIT_NO_WORKER
    if reader.truncated is not None:
        print(f"pp1q replay: warning: {reader.truncated}; read up to there", file=sys.stderr)
    if args.json:
        print(json.dumps(report.as_json(), indent=1))
    else:
        print("\n".join(report.lines()))
    sys.stdout.flush()
    for why in report.capture_errors:
        print(f"pp1q replay: {args.file}: {why}; replayed up to there", file=sys.stderr)
    # a divergence is news about the worker wherever the capture broke; a break alone
    # says only that the check was not whole
    if report.divergences:
        return EXIT_DIVERGED
    return EXIT_BAD_CAPTURE if report.capture_errors else 0


def _target_of(reader):
    """The target named in the capture's first HELLO (read ahead on a second pass)."""
    from pp1q.tools.replay import decode, target_from_identity
    from pp1q.wire import Hello

    for item in decode(reader.header.role, reader):
        if isinstance(item.message, Hello):
            return target_from_identity(item.message.identity.target_id)
    return None


def _report_json(report) -> dict:
    return {
        "ok": report.ok,
        "commits": [c.as_json() for c in report.commits],
        "failures": [{"slot": f.slot, "generation": f.generation, "round_id": f.round_id,
                      "reason": f.reason.value, "detail": f.detail} for f in report.failures],
        "proposals_ready": len(report.ready),
        "divergences": [{"time_ns": d.time_ns, "conn": d.conn, "what": d.what,
                         "reason": d.reason.value if d.reason else None}
                        for d in report.divergences],
        "stream_errors": [{"reason": e.event.reason.value, "detail": e.event.detail}
                          for e in report.stream_errors],
        "rechecked": report.rechecked,
        "not_rechecked": report.not_rechecked,
    }
