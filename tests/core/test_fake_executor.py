from __future__ import annotations

import pytest

from cadence.core.plan import ScheduledChunk, StepPlan
from cadence.core.sampling_params import SamplingParams
from cadence.executor.fake_executor import FakeExecutor, FakeExecutorError

PARAMS = SamplingParams(temperature=0.0)


def chunk(req_id, tokens, start, table, sample=True):
    return ScheduledChunk(req_id, tuple(tokens), start, tuple(table), sample, PARAMS, 0)


def test_token_is_a_function_of_history_not_of_chunking():
    whole, split = FakeExecutor(100), FakeExecutor(100)
    prompt = list(range(10))
    out = whole.execute(StepPlan(0, (chunk("a", prompt, 0, [0, 1, 2]),), block_size=4))
    split.execute(StepPlan(0, (chunk("b", prompt[:6], 0, [5, 6], sample=False),), block_size=4))
    out2 = split.execute(StepPlan(1, (chunk("b", prompt[6:], 6, [5, 6, 7]),), block_size=4))
    assert out.sampled["a"].token_id == out2.sampled["b"].token_id == whole.next_token(prompt)
    assert split.computed == [("b", 0, 6), ("b", 6, 10)]
    assert whole.reference_generate(prompt, 3)[0] == whole.next_token(prompt)


def test_reading_kv_never_written_is_an_error():
    ex = FakeExecutor(100)
    with pytest.raises(FakeExecutorError, match="never computed"):
        ex.execute(StepPlan(0, (chunk("a", [1, 2], 4, [0, 1]),), block_size=4))


def test_short_block_table_is_an_error():
    ex = FakeExecutor(100)
    with pytest.raises(FakeExecutorError, match="cannot hold"):
        ex.execute(StepPlan(0, (chunk("a", range(5), 0, [0]),), block_size=4))


def test_eos_appears_when_configured():
    ex = FakeExecutor(100, eos_token_id=2, eos_one_in=2)
    tokens = {ex.next_token([i]) for i in range(50)}
    assert 2 in tokens and len(tokens) > 2


def test_bad_arguments():
    with pytest.raises(ValueError):
        FakeExecutor(0)
    with pytest.raises(ValueError):
        FakeExecutor(10, eos_token_id=10)
