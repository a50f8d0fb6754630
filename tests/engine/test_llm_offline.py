"""The offline LLM API over a FakeExecutor engine, and engine config resolution."""

from __future__ import annotations

import pytest

from cadence.core.config import CacheConfig
from cadence.core.sampling_params import SamplingParams
from cadence.engine.config import DEFAULT_KV_CACHE_MEMORY_BYTES, resolve_num_blocks
from cadence.engine.llm import LLM, engine_config_from_kwargs
from tests.engine.conftest import make_engine


def test_generate_returns_results_in_prompt_order(tokenizer):
    engine, fake = make_engine(tokenizer, max_num_seqs=2, max_num_batched_tokens=8)
    llm = LLM.from_engine(engine)
    prompts = ["one", "two two", "three three three"]
    params = [SamplingParams(max_tokens=n) for n in (3, 5, 7)]
    results = llm.generate(prompts, params)
    assert [r.prompt for r in results] == prompts
    for r, p, n in zip(results, prompts, (3, 5, 7)):
        assert r.prompt_token_ids == tokenizer.encode(p)
        (c,) = r.outputs
        assert list(c.token_ids) == fake.reference_generate(list(r.prompt_token_ids), n)
        assert c.text == tokenizer.decode(c.token_ids)
        assert c.finish_reason == "length"
        assert r.timeline is not None and r.timeline.num_output_tokens == n


def test_generate_accepts_token_ids_and_single_prompt(tokenizer):
    llm = LLM.from_engine(make_engine(tokenizer)[0])
    (one,) = llm.generate([5, 6, 7], SamplingParams(max_tokens=2))
    assert one.prompt is None and one.prompt_token_ids == [5, 6, 7]
    two = llm.generate([[5, 6], [7]], SamplingParams(max_tokens=2))
    assert [r.prompt_token_ids for r in two] == [[5, 6], [7]]
    (text,) = llm.generate("hello", SamplingParams(max_tokens=2))
    assert text.prompt == "hello"


def test_chat_uses_the_template(tokenizer):
    engine, fake = make_engine(tokenizer)
    llm = LLM.from_engine(engine)
    messages = [{"role": "user", "content": "hi"}]
    (r,) = llm.chat(messages, SamplingParams(max_tokens=4))
    expected_prompt = tokenizer.apply_chat_template(messages)
    assert r.prompt == expected_prompt
    assert r.prompt_token_ids == tokenizer.encode(expected_prompt, add_special_tokens=False)
    assert r.prompt_token_ids[0] == tokenizer.backend.token_to_id("<|im_start|>")
    batch = llm.chat([messages, [{"role": "user", "content": "yo"}]], SamplingParams(max_tokens=2))
    assert len(batch) == 2


def test_bad_prompt_aborts_the_batch_cleanly(tokenizer):
    engine, _ = make_engine(tokenizer)
    llm = LLM.from_engine(engine)
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[1, 2], []], SamplingParams(max_tokens=2))
    assert not engine.has_unfinished()
    assert engine.scheduler.stats().num_blocks_used == 0
    with pytest.raises(ValueError, match="SamplingParams for"):
        llm.generate(["a", "b"], [SamplingParams()])
    with pytest.raises(ValueError, match="prompts"):
        llm.generate([])
    assert len(llm.generate(["ok"], SamplingParams(max_tokens=1))) == 1


def test_progress_bar_runs(tokenizer, capsys):
    llm = LLM.from_engine(make_engine(tokenizer)[0])
    results = llm.generate(["a", "b"], SamplingParams(max_tokens=3), use_tqdm=True)
    assert len(results) == 2
    assert "2/2" in capsys.readouterr().err


def test_kwargs_route_to_the_right_configs():
    cfg = engine_config_from_kwargs(
        "m.gguf", policy="eager", max_num_batched_tokens=128, block_size=32,
        enable_prefix_caching=False, dtype="float32", seed=3,
    )
    assert cfg.model == "m.gguf" and cfg.dtype == "float32" and cfg.seed == 3
    assert cfg.scheduler.policy == "eager" and cfg.scheduler.max_num_batched_tokens == 128
    assert cfg.cache.block_size == 32 and not cfg.cache.enable_prefix_caching
    with pytest.raises(TypeError, match="unknown LLM option 'max_batch'"):
        engine_config_from_kwargs(max_batch=3)
    with pytest.raises(ValueError, match="policy"):
        engine_config_from_kwargs(policy="greedy")
    # deterministic is float32 weights and compute: int8 weights quantize activations.
    assert engine_config_from_kwargs(deterministic=True, quantization="bf16").model_dtype == "float32"
    with pytest.raises(ValueError, match="quantization='int8'"):
        engine_config_from_kwargs(deterministic=True, quantization="int8")


def test_num_blocks_resolution():
    explicit = CacheConfig(num_blocks=7)
    assert resolve_num_blocks(explicit, 1000, 4, 100) is explicit
    by_memory = resolve_num_blocks(CacheConfig(kv_cache_memory_bytes=10_000), 1000, 64, 8192)
    assert by_memory.num_blocks == 10
    # Default 2 GiB, capped at what max_num_seqs * max_model_len could use: 4 * (100 / 16) -> 28.
    capped = resolve_num_blocks(CacheConfig(block_size=16), 1000, 4, 100)
    assert capped.num_blocks == 28
    big = resolve_num_blocks(CacheConfig(block_size=16), 2**20, 64, 8192)
    assert big.num_blocks == DEFAULT_KV_CACHE_MEMORY_BYTES // 2**20
    with pytest.raises(ValueError, match="less than one KV block"):
        resolve_num_blocks(CacheConfig(kv_cache_memory_bytes=10), 1000, 4, 100)
