"""ModelExecutor on a tiny random Llama: batched greedy decoding equals transformers, block copies,
sampling rows, and clear errors for plans that do not fit the model or the cache."""

from __future__ import annotations

import random

import pytest
import torch

from cadence.core.plan import ScheduledChunk, StepPlan
from cadence.core.sampling_params import SamplingParams
from cadence.executor.model_runner import ModelExecutor
from cadence.model.loader import load_model

torch.set_num_threads(2)

GREEDY = SamplingParams(temperature=0.0, max_tokens=64)
BLOCK = 4
POOL = 80


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return load_model(tiny_llama_dir, dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def hf_tiny(tiny_llama_dir):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """transformers greedy continuation without EOS stopping (full forward per token)."""
    tokens = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            tokens.append(int(model(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt):]


def chunk(req_id, tokens, start, table, sample=True, output_index=0, params=GREEDY):
    return ScheduledChunk(req_id, tuple(tokens), start, tuple(table), sample, params, output_index,
                          is_prefill=len(tokens) > 1)


def test_batched_chunked_generation_matches_transformers(tiny, hf_tiny):
    """Three requests share every step: prompts arrive in chunks of 5 while others decode."""
    rng = random.Random(0)
    prompts = [[rng.randrange(3, tiny.config.vocab_size) for _ in range(n)] for n in (17, 6, 11)]
    want = 8
    free = list(range(POOL))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-(len(p) + want) // BLOCK))] for p in prompts]
    executor = ModelExecutor(tiny, num_blocks=POOL, block_size=BLOCK)
    tokens = [list(p) for p in prompts]
    computed = [0] * 3
    outputs = [[] for _ in prompts]
    step = 0
    while any(len(o) < want for o in outputs):
        chunks = []
        for i in range(3):
            if len(outputs[i]) >= want or (i == 2 and step < 2):  # request 2 arrives late
                continue
            new = tokens[i][computed[i]:computed[i] + 5]
            done = computed[i] + len(new) == len(tokens[i])
            chunks.append(chunk(f"r{i}", new, computed[i], tables[i], done, len(outputs[i])))
        out = executor.execute(StepPlan(step, tuple(chunks), BLOCK))
        assert set(out.sampled) == {c.req_id for c in chunks if c.sample}
        assert out.forward_time_s > 0
        for c in chunks:
            i = int(c.req_id[1:])
            computed[i] = c.end_pos
            if c.sample:
                outputs[i].append(out.sampled[c.req_id].token_id)
                tokens[i].append(outputs[i][-1])
        step += 1
    for prompt, got in zip(prompts, outputs):
        assert got == hf_greedy(hf_tiny, prompt, want)


def test_forward_logits_match_transformers_last_row(tiny, hf_tiny):
    prompt = list(range(5, 30))
    executor = ModelExecutor(tiny, num_blocks=POOL, block_size=BLOCK)
    logits = executor.forward_logits(StepPlan(0, (chunk("a", prompt, 0, [9, 3, 40, 12, 7, 66, 1]),), BLOCK))
    with torch.inference_mode():
        expected = hf_tiny(torch.tensor([prompt])).logits[0, -1:]
    assert logits.shape == (1, tiny.config.vocab_size) and logits.dtype == torch.float32
    assert (logits - expected).abs().max() < 1e-4


def test_block_copy_before_forward(tiny, hf_tiny):
    """Request b shares a's first 6 tokens: a's partial block is copied, then b diverges in it."""
    executor = ModelExecutor(tiny, num_blocks=POOL, block_size=BLOCK)
    shared = [11, 12, 13, 14, 15, 16]
    a = shared + [17, 18]
    b = shared + [30, 31, 32]
    executor.execute(StepPlan(0, (chunk("a", a, 0, [3, 5]),), BLOCK))
    # b reuses block 3 as is and gets a private copy (9) of the partially shared block 5.
    plan = StepPlan(1, (chunk("b", b[6:], 6, [3, 9, 30]),), BLOCK, block_copies=((5, 9),))
    logits_b = executor.forward_logits(plan)
    # a continues in its untouched block 5.
    logits_a = executor.forward_logits(StepPlan(2, (chunk("a", [19], 8, [3, 5, 20]),), BLOCK))
    with torch.inference_mode():
        ref_b = hf_tiny(torch.tensor([b])).logits[0, -1]
        ref_a = hf_tiny(torch.tensor([a + [19]])).logits[0, -1]
    assert (logits_b[0] - ref_b).abs().max() < 1e-4
    assert (logits_a[0] - ref_a).abs().max() < 1e-4


def test_only_sampling_chunks_get_tokens(tiny):
    executor = ModelExecutor(tiny, num_blocks=POOL, block_size=BLOCK)
    plan = StepPlan(0, (chunk("mid", [5, 6, 7], 0, [1], sample=False), chunk("end", [8, 9], 0, [2])), BLOCK)
    out = executor.execute(plan)
    assert list(out.sampled) == ["end"] and out.step_id == 0
    assert executor.forward_logits(StepPlan(1, (chunk("x", [5], 3, [1], sample=False),), BLOCK)).shape[0] == 0
    empty = executor.execute(StepPlan(2, (), BLOCK))
    assert empty.sampled == {} and empty.step_id == 2


def test_seeded_sampling_is_reproducible_across_batches(tiny):
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=4)
    executor = ModelExecutor(tiny, num_blocks=POOL, block_size=BLOCK, seed=0)
    alone = executor.execute(StepPlan(0, (chunk("s", [5, 6, 7], 0, [1], params=seeded),), BLOCK))
    crowd = executor.execute(StepPlan(1, (
        chunk("other", [9, 9, 9, 9, 9], 0, [2, 3], params=SamplingParams(temperature=1.0)),
        chunk("s", [5, 6, 7], 0, [4], params=seeded),
    ), BLOCK))
    assert alone.sampled["s"].token_id == crowd.sampled["s"].token_id


@pytest.mark.parametrize("plan, message", [
    (StepPlan(0, (chunk("a", [10**6], 0, [1]),), BLOCK), "outside the model's vocabulary"),
    (StepPlan(0, (chunk("a", [-3], 0, [1]),), BLOCK), "outside the model's vocabulary"),
    (StepPlan(0, (chunk("a", [1] * 9, 0, [1, 2]),), BLOCK), "need 3"),
    (StepPlan(0, (chunk("a", [1], 0, [POOL]),), BLOCK), "outside pool"),
    (StepPlan(0, (chunk("a", [1], 0, [1]),), 8), "block_size"),
    (StepPlan(0, (chunk("a", [1], 600, list(range(POOL))),), BLOCK), "exceeds the model's context"),
    (StepPlan(0, (chunk("a", [1], 0, [1]),), BLOCK, block_copies=((1, POOL),)), "outside pool"),
    (StepPlan(0, (chunk("a", [1], 0, [1]), chunk("a", [2], 0, [2])), BLOCK), "appears twice"),
    (StepPlan(0, (chunk("a", [], 0, [1]),), BLOCK), "no tokens"),
])
def test_bad_plans_raise_clear_errors(tiny, plan, message):
    executor = ModelExecutor(tiny, num_blocks=POOL, block_size=BLOCK)
    with pytest.raises(ValueError, match=message):
        executor.execute(plan)
