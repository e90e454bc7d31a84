"""Fault rules from text, for ``pp1q chaos proxy --fault SPEC``.

    SPEC = KIND:MESSAGE[:key=value]...

KIND is a frame fault (delay, drop, bit_flip, truncate, duplicate, replay, reorder,
disconnect); MESSAGE a wire message type (reply, completion, proposal, step, commit,
...) or ``any``. Keys: ``nth``, ``every``, ``times``, ``p`` (probability, seeded), ``dir``
(to_verifier, the default, or to_worker), the fault's own parameters (``seconds`` for
delay; ``region``, ``offset``, ``bit`` for bit_flip; ``keep`` for truncate and
disconnect), and any other key is a control field the frame must carry with that value
(``index=2``, ``slot=0``). Examples: ``drop:reply:index=2:every=10:times=0``,
``delay:completion:seconds=1.5:nth=3``, ``bit_flip:reply:p=0.01:times=0:every=1``,
``duplicate:proposal:every=4:times=0``.
"""

from __future__ import annotations

import random

from pp1q.tools.chaos.faults import (
    BitFlip,
    Delay,
    Direction,
    Disconnect,
    Drop,
    Duplicate,
    FaultKind,
    Reorder,
    Replay,
    Rule,
    Truncate,
)
from pp1q.wire import MsgType

_FAULTS = {FaultKind.DELAY: (Delay, {"seconds": float}), FaultKind.DROP: (Drop, {}),
           FaultKind.BIT_FLIP: (BitFlip, {"region": str, "offset": int, "bit": int}),
           FaultKind.TRUNCATE: (Truncate, {"keep": int}),
           FaultKind.DUPLICATE: (Duplicate, {}), FaultKind.REPLAY: (Replay, {}),
           FaultKind.REORDER: (Reorder, {}),
           FaultKind.DISCONNECT: (Disconnect, {"keep": int})}
_SCHEDULE = {"nth": int, "every": int, "times": int}


def parse_rule(spec: str, rng: random.Random) -> Rule:
    """One Rule from SPEC; ValueError (with the reason) for anything malformed."""
    kind, _, rest = spec.partition(":")
    mtype, *pairs = rest.split(":") if rest else ("any",)
    try:
        fault_cls, params = _FAULTS[FaultKind(kind)]
    except ValueError:
        raise ValueError(f"{spec!r}: unknown fault {kind!r} "
                         f"(one of {', '.join(k.value for k in _FAULTS)})") from None
    msg = None
    if mtype != "any":
        try:
            msg = MsgType[mtype.upper()]
        except KeyError:
            raise ValueError(f"{spec!r}: unknown message type {mtype!r}") from None
    fault_args, schedule, where = {}, {}, {}
    direction, probability = Direction.TO_VERIFIER, 1.0
    for pair in pairs:
        key, eq, text = pair.partition("=")
        if not eq:
            raise ValueError(f"{spec!r}: {pair!r} is not key=value")
        try:
            if key in params:
                fault_args[key] = params[key](text)
            elif key in _SCHEDULE:
                schedule[key] = int(text)
            elif key == "p":
                probability = float(text)
            elif key == "dir":
                direction = Direction(text)
            else:
                where[key] = int(text)
        except ValueError:
            raise ValueError(f"{spec!r}: bad value for {key}: {text!r}") from None
    if fault_cls is Delay and "seconds" not in fault_args:
        raise ValueError(f"{spec!r}: delay needs seconds=S")
    return Rule(fault_cls(**fault_args), direction=direction, msg_type=msg, where=where,
                probability=probability, rng=rng if probability < 1.0 else None, **schedule)
