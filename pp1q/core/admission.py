"""Depth admission: which draft positions a round will verify, decided before sampling.

Rule (seed: "Depth admission must not inspect its own future draws"): the event
"position i will be verified" must be measurable before x_i is sampled. Deciding i may
use the committed history, load measured before drawing, and x_1..x_{i-1}; never x_i
or anything later. Admission is a sequential stopping rule: decide, sample only if
admitted, and never reopen a stopped prefix.

``draft_chain`` enforces the rule by construction: a policy sees an ``AdmissionView``
built before x_i exists, the proposal function runs only after admission, and the loop
ends at the first refusal. Selecting on a draw after seeing it (admit x_1 only when it
is token 0, else resample target-only) biases the output even with an exact verifier:
tests/core/test_admission.py and tests/core/test_distribution.py show 3/4 instead of 1/2.

``FixedDepth`` is the only shipped policy: PP1 fixes depth before sampling. Any
adaptive policy needs its own proof and conditional-frequency suite first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pp1q.core.errors import LocalProtocolError, Reason


@dataclass(frozen=True)
class AdmissionView:
    """Everything a policy may see when deciding whether position ``position`` is verified."""

    position: int  # i, 1-based within the round
    committed: tuple[int, ...]  # committed history (token ids), before this round
    load: float | None  # measured before drawing x_i (None: not measured)
    drafted: tuple[int, ...]  # x_1..x_{i-1}; never x_i or later


class AdmissionPolicy(Protocol):
    name: str

    def admit(self, view: AdmissionView) -> bool:
        """True: position ``view.position`` will be sampled and verified."""
        ...


@dataclass(frozen=True)
class FixedDepth:
    """Verify exactly ``depth`` positions, whatever is drafted: fixed before sampling."""

    depth: int
    name: str = "fixed"

    def __post_init__(self) -> None:
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 1:
            raise LocalProtocolError(Reason.UNEXPECTED_SIZE, f"depth {self.depth!r}")

    def admit(self, view: AdmissionView) -> bool:
        return view.position <= self.depth


SHIPPED_POLICIES = {"fixed": FixedDepth}  # no adaptive policy ships enabled


def draft_chain(
    policy: AdmissionPolicy,
    *,
    max_depth: int,
    propose: Callable[[int, tuple[int, ...]], int],
    committed: Sequence[int] = (),
    measure_load: Callable[[], float] | None = None,
) -> tuple[int, ...]:
    """Draft up to ``max_depth`` tokens under a sequential stopping rule.

    For i = 1..max_depth: measure load, ask ``policy.admit`` with x_1..x_{i-1} only;
    on refusal stop for good; else ``propose(i, drafted)`` samples x_i (the only place
    a proposal draw is made). Returns the admitted chain x_1..x_k.
    """
    history = tuple(int(t) for t in committed)
    drafted: list[int] = []
    for i in range(1, max_depth + 1):
        view = AdmissionView(
            position=i,
            committed=history,
            load=measure_load() if measure_load is not None else None,
            drafted=tuple(drafted),
        )
        verdict = policy.admit(view)
        if not isinstance(verdict, bool):
            raise LocalProtocolError(Reason.STATE_NOT_ALLOWED, "admit must return a bool")
        if not verdict:
            break  # a stopped prefix never reopens: no later position is asked
        drafted.append(int(propose(i, tuple(drafted))))
    return tuple(drafted)
