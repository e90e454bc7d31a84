"""``pp1q demo --plot FILE.png``: the demo's evidence as a picture (matplotlib, optional:
``pip install 'pp1q[plot]'``). Three panels: the exactness check's token frequencies,
speculative beside target-only; accepted drafts per round; and acceptance by draft
position (the share of rounds whose first i drafts were all accepted)."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path

from pp1q.runtime.files import open_output
from pp1q.tools.exactness import Homogeneity

PLOT_HINT = "--plot needs matplotlib: pip install 'pp1q[plot]'"


def require_matplotlib():
    """pyplot on the file-only Agg backend, or ImportError saying what to install."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        from matplotlib import pyplot
    except ImportError as e:
        raise ImportError(PLOT_HINT) from e
    return pyplot


def by_position(accepted_hist: Sequence[int], depth: int) -> list[float]:
    """For i = 1..depth: the share of rounds that accepted at least i drafts."""
    rounds = sum(accepted_hist)
    return [sum(accepted_hist[i:]) / rounds if rounds else 0.0 for i in range(1, depth + 1)]


def write_plot(path: str, *, title: str, exactness: Homogeneity | None,
               labels: tuple[str, str], accepted_hist: Sequence[int] | None, depth: int,
               name: Callable[[int], str] = str) -> None:
    """Write the figure to ``path`` (any matplotlib format, by its suffix; .png usual, and
    PNG without one). ``name(token)``: how a token is labelled on the exactness panel
    (its text for a real model). The figure is rendered first, then written with
    open_output: a FIFO, folder or device at ``path`` is refused by name (savefig's own
    open blocked on a FIFO for ever)."""
    plt = require_matplotlib()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ex, hist, pos = axes
    if exactness is not None:
        na, nb = sum(exactness.a), sum(exactness.b)
        xs = range(len(exactness.bins))
        ex.bar([x - 0.2 for x in xs], [c / na for c in exactness.a], 0.4, label=labels[0])
        ex.bar([x + 0.2 for x in xs], [c / nb for c in exactness.b], 0.4, label=labels[1])
        ex.set_xticks(list(xs), ["other" if t is None else name(t) for t in exactness.bins],
                      rotation=60, fontsize=7)
        ex.set_ylabel("frequency")
        ex.set_title(f"first token, {na} + {nb} samples: chi-square {exactness.chi2:.1f}, "
                     f"df {exactness.df}, p = {exactness.p_value:.3f}", fontsize=9)
        ex.legend(fontsize=8)
    else:
        ex.set_axis_off()
        ex.set_title("exactness check skipped", fontsize=9)
    counts = list(accepted_hist or [])[: depth + 1]
    if sum(counts):
        rounds = sum(counts)
        mean = sum(i * c for i, c in enumerate(counts)) / rounds
        hist.bar(range(len(counts)), [c / rounds for c in counts])
        hist.set_title(f"accepted drafts per round ({rounds} rounds, mean {mean:.2f})",
                       fontsize=9)
        hist.set_xlabel("accepted drafts")
        hist.set_ylabel("share of rounds")
        shares = by_position(counts, depth)
        pos.plot(range(1, depth + 1), shares, marker="o")
        pos.set_ylim(0, 1)
        pos.set_xticks(range(1, depth + 1))
        pos.set_xlabel("draft position i")
        pos.set_ylabel("rounds accepting drafts 1..i")
        pos.set_title("acceptance by draft position", fontsize=9)
    else:
        for ax in (hist, pos):
            ax.set_axis_off()
        hist.set_title("no speculative rounds", fontsize=9)
    fig.suptitle(title, fontsize=10)
    image = io.BytesIO()
    try:
        fig.tight_layout()
        fig.savefig(image, format=Path(path).suffix[1:].lower() or "png", dpi=100)
    finally:
        plt.close(fig)  # pyplot keeps every figure not closed
    with open_output(path) as f:
        f.write(image.getbuffer())
