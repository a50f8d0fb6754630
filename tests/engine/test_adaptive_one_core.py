"""--policy adaptive on one core is the colocated slo policy, step for step (issue 34).

Issue 34: with one core (`taskset -c 0`, or a thread count of 1) adaptive must behave as the
colocated slo policy. An engine takes its core count at its first step (the calling thread's
torch thread count, capped by the CPU affinity: `_engine_cores`), so both ways of giving it one
core are run here, with no core count passed (as an engine built from a loaded CPU model
enables its split), against a colocated slo engine on the same workload: the same steps (each
prompt chunk and decode, in order) and the same tokens, with no split ever decided.
"""

from __future__ import annotations

import os

import pytest
import torch

from test_core_split import WORKLOAD, drive, fake_engine


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def one_cpu():
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    yield
    os.sched_setaffinity(0, before)


@pytest.mark.parametrize("one_core", ["one_thread", "one_cpu"])
def test_adaptive_on_one_core_steps_exactly_as_colocated_slo(one_core, request):
    slo, fake_slo = fake_engine(None, policy="slo")
    expected = drive(slo, WORKLOAD)
    request.getfixturevalue(one_core)
    engine, fake = fake_engine(None, policy="adaptive")
    assert engine.scheduler.sched.core_split == "interleave"
    engine.enable_core_split()  # no core count: the engine reads it at its first step
    got = drive(engine, WORKLOAD)
    assert engine.split_stepper.split.num_cores == 1
    assert engine.split_stepper.split.num_changes == 0
    assert got == expected
    assert fake.computed == fake_slo.computed  # the same steps, in the same order
