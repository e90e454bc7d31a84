"""`pp1q bench goals`' in-process core round (pp1q.tools.bench.core_round): every round
validates, decides and commits through the two sans-IO endpoints, the worker following
the verifier's prefix from round to round. Timings are not asserted (speed lives in the
benchmark); what could fail is the round itself."""

import msgspec
import pytest

from pp1q.tools.bench import core_round
from pp1q.tools.bench.round_peer import VOCAB


@pytest.mark.parametrize(("form", "requests"), [("sparse", 4), ("dense", 4), ("sparse", 64)])
def test_rounds_commit_and_the_worker_follows(form: str, requests: int) -> None:
    core = core_round._CoreRound(form, requests)
    for _ in range(3):
        phases = core.round()
        assert set(phases) == set(core_round.PHASES) and all(t > 0 for t in phases.values())
    # round 3's STEPs passed the worker's checks of last_committed and the prefix digest,
    # so it applied rounds 1 and 2's COMMITs as the verifier did; each commits >= 1 token
    for slot, prefix in core.prefixes.items():
        assert core.w.context(slot) == prefix.tokens[:len(core.w.context(slot))]
        assert len(core.w.context(slot)) >= 11 + 2 and len(prefix.tokens) >= 11 + 3
    assert len(core.prefixes) == requests


def test_a_commit_the_worker_would_apply_otherwise_stops_the_run() -> None:
    # planted through the round's own seam (the COMMITs it sends next): a correction
    # token the verifier did not commit leaves the worker on another prefix, whose digest
    # the next STEP does not match; the bench must stop, not time a refused round
    core = core_round._CoreRound("sparse")
    core.round()
    first = core.commits[0]
    core.commits[0] = msgspec.structs.replace(first, token=(first.token + 1) % VOCAB)
    with pytest.raises(RuntimeError, match="refused"):
        core.round()


def test_time_core_floor_is_the_critical_path_of_its_phases() -> None:
    t = core_round.time_core("sparse", 2)
    assert set(t) == {*core_round.PHASES, "floor"}
    assert t["floor"] == t["steps"] + t["read_steps"] + max(t["rows"], t["read_rows"])
    line = core_round.describe(t, t["floor"] / 4)
    assert "floor" in line and "= 4.00x raw" in line


def test_per_request_line_reads_both_batch_sizes() -> None:
    line = core_round.per_request_by_batch(2)
    for n in (core_round.REQUESTS, 64):  # each a run of its own, every phase a number
        cell = line.split(f"{n} requests ")[1].split(";")[0]
        assert len([float(x) for x in cell.split(" / ")]) == len(core_round.PHASES)
