"""KV offload on a real (tiny random Llama) model: swap preemption to the disk tier, prefix-cache
blocks spilled to disk and reloaded, disk faults that fall back to recompute. Greedy tokens stay
those of an uncontended run; the disk tier's files are gone after close."""

from __future__ import annotations

import errno
import os

import pytest
import torch

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.sampling_params import SamplingParams
from cadence.engine.config import EngineConfig
from cadence.engine.llm import LLM
from cadence.engine.llm_engine import LLMEngine
from cadence.executor.disk_kv import remove_stale_dirs
from cadence.model.loader import load_model
from tests.engine.conftest import fix_step_costs

NUM_TOKENS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
PREEMPT_PROMPTS = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Hello world! How are you today? I am fine, thank you. " * 3,
    "Paged attention stores keys and values in fixed-size blocks. " * 3,
    "def forward(self, x): return self.norm(x + self.attn(x)) " * 3,
]
SHARED = "Continuous batching mixes prefill chunks with decode steps under a token budget. " * 2
# Run one at a time: the middle ones evict the shared prefix's blocks from the small pool.
SPILL_PROMPTS = [
    SHARED + "The quick brown fox",
    "Paged attention stores keys and values in fixed-size blocks, one table per request.",
    "def forward(self, x): return self.norm(x + self.attn(x)) and nothing else at all",
    SHARED + "Hello world! How are you",
]


@pytest.fixture(scope="module")
def tiny_loaded(tiny_llama_dir):
    return load_model(tiny_llama_dir, dtype="float32", device="cpu")


def build(loaded, *, policy="chunked", num_blocks=None, block_size=4, prefix=True,
          max_seqs=64, swap_blocks=0, offload_dir=None, disk_blocks=256, fast_disk=True,
          kv_dtype="auto"):
    cfg = EngineConfig(
        scheduler=SchedulerConfig(policy=policy, max_num_batched_tokens=64,
                                  max_num_seqs=max_seqs),
        cache=CacheConfig(block_size=block_size, num_blocks=num_blocks,
                          enable_prefix_caching=prefix, num_swap_blocks=swap_blocks,
                          kv_offload_dir=offload_dir, kv_offload_disk_blocks=disk_blocks),
        startup_profile=False, kv_cache_dtype=kv_dtype,
    )
    engine = LLMEngine.from_loaded(loaded, cfg)
    if fast_disk and offload_dir is not None:
        # The tiny model recomputes faster than any disk: pretend a fast disk so the cost
        # choice takes it (the real model's choice is measured in benchmarks/kv_offload_cost).
        engine.scheduler.disk_block_write_s = engine.scheduler.disk_block_read_s = 1e-7
    return engine


def generate(engine, prompts):
    results = LLM.from_engine(engine).generate(prompts, GREEDY)
    engine.scheduler.check_integrity()
    assert engine.scheduler.stats().num_blocks_used == 0
    return [r.outputs[0].token_ids for r in results], engine.scheduler.stats()


def tight_cache_blocks(loaded, prompts, block_size):
    """Each request fits alone, two admitted prompts leave no room to decode (preemption)."""
    lengths = [len(loaded.tokenizer.encode(p)) for p in prompts]
    prompt_blocks = sorted(-(-n // block_size) for n in lengths)
    alone = max(-(-(n + NUM_TOKENS) // block_size) for n in lengths)
    return max(alone + 1, prompt_blocks[0] + prompt_blocks[1] + 1)


@pytest.fixture(scope="module")
def preempt_reference(tiny_loaded):
    tokens, _ = generate(build(tiny_loaded, policy="eager", max_seqs=1, prefix=False,
                               block_size=16), PREEMPT_PROMPTS)
    return tokens


@pytest.mark.parametrize("policy", ["eager", "chunked", "slo"])
@pytest.mark.parametrize("prefix", [True, False])
def test_tiny_model_outputs_survive_disk_swap_preemption(tiny_loaded, preempt_reference,
                                                         tmp_path, policy, prefix):
    num_blocks = tight_cache_blocks(tiny_loaded, PREEMPT_PROMPTS, block_size=4)
    engine = fix_step_costs(build(tiny_loaded, policy=policy, prefix=prefix,
                                  num_blocks=num_blocks, offload_dir=str(tmp_path)))
    tokens, stats = generate(engine, PREEMPT_PROMPTS)
    assert tokens == preempt_reference
    assert stats.num_disk_swap_preemptions_total > 0
    assert stats.num_blocks_disk_swapped_in_total > 0
    assert stats.num_kv_offload_failures_total == 0
    if not prefix:  # nothing spilled: an idle step deletes the last swapped request's files
        engine.step()
        assert engine.executor.disk.num_files == 0
        assert [f for f in os.listdir(engine.executor.disk.dir) if f.endswith(".kv")] == []
    block_dir = engine.executor.disk.dir
    engine.close()
    assert not os.path.exists(block_dir) and os.listdir(tmp_path) == []


def test_tiny_model_host_tier_full_goes_to_disk(tiny_loaded, preempt_reference, tmp_path):
    num_blocks = tight_cache_blocks(tiny_loaded, PREEMPT_PROMPTS, block_size=4)
    # Room on the host for the first preempted request, not for all of them.
    engine = build(tiny_loaded, num_blocks=num_blocks, swap_blocks=20, offload_dir=str(tmp_path))
    engine.scheduler.swap_block_copy_s = 1e-9  # host copies cheaper than the disk
    tokens, stats = generate(engine, PREEMPT_PROMPTS)
    assert tokens == preempt_reference
    assert stats.num_blocks_swapped_out_total > 0
    assert stats.num_blocks_disk_swapped_out_total > 0
    engine.close()


def test_float16_pool_survives_host_and_disk_swap_and_prefix_spill(tiny_loaded, tmp_path):
    # What auto gives a GGUF model: the tiers hold blocks in the pool's storage dtype, so swapped
    # and spilled float16 blocks come back as they left (an uncontended float16 run's tokens).
    reference, _ = generate(build(tiny_loaded, policy="eager", max_seqs=1, prefix=False, block_size=16,
                                  kv_dtype="float16"), PREEMPT_PROMPTS)
    num_blocks = tight_cache_blocks(tiny_loaded, PREEMPT_PROMPTS, block_size=4)
    engine = build(tiny_loaded, num_blocks=num_blocks, swap_blocks=20, offload_dir=str(tmp_path / "swap"),
                   kv_dtype="float16")
    engine.scheduler.swap_block_copy_s = 1e-9
    assert engine.executor.kv_cache.dtype == engine.executor.host_kv.dtype == torch.float16
    tokens, stats = generate(engine, PREEMPT_PROMPTS)
    assert tokens == reference
    assert stats.num_blocks_swapped_out_total > 0 and stats.num_blocks_disk_swapped_in_total > 0
    engine.close()
    fresh, _ = generate(build(tiny_loaded, policy="eager", max_seqs=1, prefix=False, block_size=16,
                              kv_dtype="float16"), SPILL_PROMPTS)
    lengths = [len(tiny_loaded.tokenizer.encode(p)) for p in SPILL_PROMPTS]
    engine = build(tiny_loaded, max_seqs=1, num_blocks=max(-(-(n + NUM_TOKENS) // 4) for n in lengths) + 1,
                   offload_dir=str(tmp_path / "spill"), kv_dtype="float16")
    tokens, stats = generate(engine, SPILL_PROMPTS)
    assert tokens == fresh and stats.num_prefix_blocks_reloaded_total > 0
    engine.close()


@pytest.mark.parametrize("fail", ["write", "read"])
def test_tiny_model_disk_faults_fall_back_to_recompute(tiny_loaded, preempt_reference, tmp_path,
                                                       fail, caplog):
    num_blocks = tight_cache_blocks(tiny_loaded, PREEMPT_PROMPTS, block_size=4)
    engine = build(tiny_loaded, num_blocks=num_blocks, offload_dir=str(tmp_path))
    store = engine.executor.disk

    def broken(*args, **kwargs):
        raise OSError(errno.ENOSPC if fail == "write" else errno.EIO, "injected")

    setattr(store, fail, broken)
    tokens, stats = generate(engine, PREEMPT_PROMPTS)
    assert tokens == preempt_reference
    assert stats.num_kv_offload_failures_total > 0
    assert "recomputed" in caplog.text
    engine.close()


def test_tiny_model_prefix_spill_and_reload_equal_fresh_compute(tiny_loaded, tmp_path):
    fresh, _ = generate(build(tiny_loaded, policy="eager", max_seqs=1, prefix=False,
                              block_size=16), SPILL_PROMPTS)
    lengths = [len(tiny_loaded.tokenizer.encode(p)) for p in SPILL_PROMPTS]
    # Room for the largest request only: each one evicts the cached blocks of the others.
    num_blocks = max(-(-(n + NUM_TOKENS) // 4) for n in lengths) + 1
    engine = build(tiny_loaded, max_seqs=1, num_blocks=num_blocks, offload_dir=str(tmp_path))
    tokens, stats = generate(engine, SPILL_PROMPTS)
    assert tokens == fresh
    assert stats.num_prefix_blocks_spilled_total > 0
    assert stats.num_prefix_blocks_reloaded_total > 0
    # Without the disk tier, the last prompt gets no prefix hit at all.
    plain = build(tiny_loaded, max_seqs=1, num_blocks=num_blocks)
    plain_tokens, plain_stats = generate(plain, SPILL_PROMPTS)
    assert plain_tokens == fresh
    assert stats.prefix_cache_hits > plain_stats.prefix_cache_hits
    engine.close()


def test_stale_block_dirs_of_dead_engines_are_removed(tmp_path):
    dead = tmp_path / "cadence-kv-999999999-abc"
    dead.mkdir()
    (dead / "0.kv").write_bytes(b"x")
    mine = tmp_path / f"cadence-kv-{os.getpid()}-def"
    mine.mkdir()
    other = tmp_path / "unrelated"
    other.mkdir()
    assert remove_stale_dirs(str(tmp_path)) == 1
    assert not dead.exists() and mine.exists() and other.exists()
