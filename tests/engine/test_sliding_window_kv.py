"""A sliding-window model (Mistral, window 8) through the engine: its KV blocks that fall out of
the window are given back, so a sequence longer than the whole pool runs, and its greedy tokens
are still transformers' (full recompute, the window applied by transformers)."""

from __future__ import annotations

import os

import pytest
import torch

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.sampling_params import SamplingParams
from cadence.engine.config import EngineConfig
from cadence.engine.llm import LLM
from cadence.engine.llm_engine import LLMEngine
from cadence.model.loader import load_model

NUM_TOKENS = 24


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    import transformers

    from tests.model.family_checkpoints import WINDOW, build_family_checkpoint

    path = str(tmp_path_factory.mktemp("mistral_window"))
    os.makedirs(path, exist_ok=True)
    build_family_checkpoint(path, "mistral_window")
    ours = load_model(path, dtype="float32", device="cpu")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return ours, theirs, WINDOW


def hf_greedy(model, prompt_ids: list[int]) -> list[int]:
    ids = list(prompt_ids)
    with torch.inference_mode():
        for _ in range(NUM_TOKENS):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids):]


def test_sequence_longer_than_the_pool_runs_and_matches_transformers(mistral):
    ours, theirs, window = mistral
    assert ours.config.layer_types is not None and ours.config.sliding_window == window
    prompt = [(11 * i + 5) % 300 + 3 for i in range(40)]
    block_size, num_blocks = 4, 8  # 32 positions; the sequence is 64 tokens long
    assert len(prompt) + NUM_TOKENS > num_blocks * block_size
    cfg = EngineConfig(
        scheduler=SchedulerConfig(policy="chunked", max_num_batched_tokens=8, max_num_seqs=4),
        cache=CacheConfig(block_size=block_size, num_blocks=num_blocks, enable_prefix_caching=True),
    )
    engine = LLMEngine.from_loaded(ours, cfg)
    assert engine.scheduler.kv.sliding_window == window
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    out = LLM.from_engine(engine).generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    assert list(out.outputs[0].token_ids) == hf_greedy(theirs, prompt)
    engine.scheduler.check_integrity()
    assert engine.scheduler.kv.pool.num_free_blocks == num_blocks
