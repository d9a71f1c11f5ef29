"""lab.units.flash_attention.per_call_ms on the CPU, with CUDA's events and synchronize replaced by a clock that counts
calls: the functions take turns, the collector is off while they are timed and on again after."""
import gc

import pytest
import torch

from lab.measure import QUANTILES
from lab.units.flash_attention import per_call_ms


class Clock:
    """Fake CUDA events: a time that is the number of calls so far, each call of fn costing what it says."""
    now = 0.0

    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = Clock.now

    def elapsed_time(self, end):
        return end.t - self.t


@pytest.fixture
def clock(monkeypatch):
    Clock.now = 0.0
    monkeypatch.setattr(torch.cuda, "Event", Clock)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    return Clock


def test_providers_take_turns_and_each_gets_its_own_cost(clock):
    order, collecting = [], []

    def provider(name, cost):
        def fn():
            clock.now += cost
            collecting.append(gc.isenabled())
            if not order or order[-1] != name:
                order.append(name)
        return fn

    was = gc.isenabled()
    got = per_call_ms({"a": provider("a", 2.0), "b": provider("b", 3.0), "c": provider("c", 5.0)},
                              calls=4, repeats=6)
    assert gc.isenabled() == was
    assert {name: q[0.5] for name, q in got.items()} == {"a": 2.0, "b": 3.0, "c": 5.0}
    assert set(got["a"]) == set(QUANTILES)
    timed = order[3:]  # after one warm-up run each
    assert timed == ["a", "b", "c", "b", "c", "a", "c", "a", "b"] * 2  # one run each per round, rotating
    assert len(collecting) == 3 * 4 * 7 and not any(collecting[3 * 4:])  # collector off while timed


def test_the_collector_comes_back_on_after_a_failing_call(clock):
    calls = []

    def fails_when_timed():
        calls.append(1)
        if len(calls) > 2:
            raise RuntimeError("boom")

    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="boom"):
        per_call_ms({"f": fails_when_timed}, calls=2, repeats=3)
    assert gc.isenabled()
