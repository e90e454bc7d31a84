"""The part of ``pp1q demo`` that both demos (toy and real model) share: start a daemon
pair, run the demo's body against it, keep the daemons up on ``--keep``, and end the
same way on every path (one error message with the daemons' last log lines, status 1;
Ctrl-C 130; the daemons always stopped; their log folder, which also holds the pair's
draw secret, removed unless the run failed, when its path is printed for the logs); and
what both summaries print (totals, the exactness check)."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable


def run_on_pair(log_dir: str, start: Callable, body: Callable, keep: bool,
                try_line: Callable[[str], str]) -> int:
    """``start()`` returns (worker, verifier, url); ``body(worker, verifier, url)`` runs
    the demo; ``try_line(url)`` is the command suggested while ``keep`` holds them up."""
    from pp1q.tools.client import ApiError

    daemons = []
    done = False  # logs are kept on every path that is not a clean end
    try:
        worker, verifier, url = start()
        daemons = [worker, verifier]
        body(worker, verifier, url)
        if keep:
            print(f"\ndaemons left running (logs in {log_dir}); Ctrl-C to stop. Try:\n"
                  f"  {try_line(url)}")
            while all(d.alive() for d in daemons):
                time.sleep(1)
            gone = [d.role for d in daemons if not d.alive()]
            raise RuntimeError(f"the {' and '.join(gone)} stopped")
        done = True
        return 0
    except (ApiError, RuntimeError, OSError) as e:
        print(f"pp1q demo failed: {e}", file=sys.stderr)
        for d in daemons:
            print(f"--- {d.role} log ({d.log_path}), last lines:\n{d.log_tail()}",
                  file=sys.stderr)
        print(f"daemon logs kept in {log_dir}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        done = True
        return 130
    finally:
        for d in reversed(daemons):
            d.stop()
        if done:  # a folder per run would pile up in the temp dir
            shutil.rmtree(log_dir, ignore_errors=True)


def batch_totals(answers) -> tuple[int, int, int, int]:
    """(tokens, rounds, accepted drafts, drafted tokens) over one batch's answers."""
    return (sum(len(a["token_ids"]) for a in answers),
            sum(a["stats"]["rounds"] for a in answers),
            sum(a["stats"]["accepted"] for a in answers),
            sum(a["stats"]["drafted"] for a in answers))


def report_exactness(samples, name=str):
    """The exactness check both demos print: speculative vs target-only first tokens as
    bars, the chi-square and its verdict. Returns the Homogeneity (for --plot)."""
    from pp1q.tools.exactness import bars, homogeneity

    h = homogeneity(*samples)
    for line in bars(h, ("speculative", "target-only"), name=name):
        print(line)
    if h.df < 1:  # one bin: no statistic to test (p is NaN, which is not a difference)
        verdict = "one bin only (too few samples, or one token dominates): nothing to test"
    elif h.p_value >= 0.01:
        verdict = "no evidence of a difference"
    else:
        verdict = "the samples differ (expected once in 100 runs by chance)"
    print(f"  chi-square {h.chi2:.1f} on {h.df} degrees of freedom, p = {h.p_value:.3f}: "
          f"{verdict}")
    return h
