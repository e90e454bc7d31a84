"""The link's STEPs in flight (pp1q.verifier.steps_in_flight), sans-IO: places per batch,
the design's two batches, the gauge that shows a leaked place."""

import asyncio

from pp1q.verifier.steps_in_flight import MAX_BATCHES_IN_FLIGHT, StepsInFlight


class Gauge:
    def __init__(self) -> None:
        self.value = None

    def set(self, v) -> None:
        self.value = v


def futures(loop, *slots):
    return {s: loop.create_future() for s in slots}


def test_two_batches_fill_it_and_the_last_outcome_of_one_frees_a_place():
    loop = asyncio.new_event_loop()
    try:
        gauge = Gauge()
        steps = StepsInFlight(gauge)
        first, second = futures(loop, 0, 1), futures(loop, 2)
        steps.add(first)
        assert steps.has_room
        steps.add(second)
        assert MAX_BATCHES_IN_FLIGHT == 2 and not steps.has_room
        assert gauge.value == 3
        assert steps.resolve(0, "a") is False  # slot 1 still holds the first batch
        assert first[0].result() == "a" and not steps.has_room and gauge.value == 2
        assert steps.resolve(1, "b") is True and steps.has_room and gauge.value == 1
        assert steps.resolve(1, "again") is False  # an outcome twice: nothing more
        assert first[1].result() == "b"
    finally:
        loop.close()


def test_an_outcome_for_a_cancelled_waiter_still_frees_its_place():
    # a request cancelled mid-round (its client left) cancels its future; the RESET's
    # outcome must still free the batch place, or two such stop every STEP
    loop = asyncio.new_event_loop()
    try:
        gauge = Gauge()
        steps = StepsInFlight(gauge)
        batch = futures(loop, 4)
        steps.add(batch)
        batch[4].cancel()
        assert steps.resolve(4, "reset") is True
        assert gauge.value == 0 and steps.has_room
    finally:
        loop.close()


def test_an_empty_write_adds_no_batch_and_clear_drops_every_place():
    loop = asyncio.new_event_loop()
    try:
        gauge = Gauge()
        steps = StepsInFlight(gauge)
        steps.add({})
        steps.add({})
        assert steps.has_room and gauge.value is None
        steps.add(futures(loop, 0))
        steps.add(futures(loop, 1))
        steps.clear()
        assert steps.has_room and gauge.value == 0
    finally:
        loop.close()
