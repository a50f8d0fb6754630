"""The engine states its memory bound at startup and refuses a pool that cannot fit (issue 13)."""

from __future__ import annotations

import pytest

from cadence.core.config import CacheConfig
from cadence.engine.config import EngineConfig
from cadence.engine.llm_engine import LLMEngine
from cadence.engine.memory_bound import (
    activation_bytes,
    available_bytes,
    model_bytes,
    resident_bytes,
)


@pytest.fixture(scope="module")
def tiny_loaded(tiny_llama_dir):
    from cadence.model.loader import load_model

    return load_model(tiny_llama_dir, dtype="float32", device="cpu")


def test_bound_is_stated_and_adds_up(tiny_loaded, capsys):
    engine = LLMEngine.from_loaded(tiny_loaded, EngineConfig(cache=CacheConfig(num_blocks=64)))
    bound = engine.memory_bound
    assert "memory bound: weights" in capsys.readouterr().err
    kv = engine.executor.kv_cache
    allocated = sum(t.numel() * t.element_size() for t in list(kv.k) + list(kv.v))
    assert bound.kv_pool_bytes == allocated
    sched = engine.config.scheduler
    assert bound.activation_bytes == activation_bytes(tiny_loaded.config,
                                                      sched.max_num_batched_tokens,
                                                      sched.max_num_seqs)
    assert bound.total_bytes == (bound.weights_bytes + bound.runtime_bytes + bound.kv_pool_bytes
                                 + bound.activation_bytes)
    # On CPU the bound starts from what the process holds (weights, runtime, loader copies):
    # the resident set now, with the pool allocated, is within it.
    rss = resident_bytes()
    assert bound.runtime_bytes > 0 and rss is not None
    assert rss <= bound.total_bytes
    assert bound.weights_bytes + bound.runtime_bytes >= rss - allocated - (64 << 20)
    engine.close()


def test_weights_are_counted_once_per_storage(tiny_loaded):
    # The fused qkv and gate/up buffers hold the rows the child projections' weights view:
    # the weights take what the parameters take, not that plus the fused copies.
    model = tiny_loaded.model
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    fused = sum(b.numel() * b.element_size() for name, b in model.named_buffers()
                if name.endswith("fused_weight"))
    assert fused > 0
    assert model_bytes(model) == params


def test_pool_that_cannot_fit_fails_at_startup(tiny_loaded):
    available = available_bytes(tiny_loaded.device)
    assert available is not None and available > 0
    # Far more blocks than this machine's memory could hold: refused before allocating.
    with pytest.raises(ValueError, match="available"):
        LLMEngine.from_loaded(tiny_loaded, EngineConfig(cache=CacheConfig(num_blocks=10**9)))


def test_kv_pool_from_a_share_of_free_memory(tiny_loaded, capsys):
    """kv_cache_memory_fraction (what vLLM's gpu_memory_utilization maps to): the pool is that
    share of the memory free after the weights load, less one step's activations."""
    from cadence.core.config import SchedulerConfig

    sched = SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=64, max_model_len=512)
    act = activation_bytes(tiny_loaded.config, 64, 256)
    want = 16 * 2**20  # far below the ceiling of 256 sequences x 512 tokens
    fraction = (want + act) / available_bytes(tiny_loaded.device)
    engine = LLMEngine.from_loaded(tiny_loaded, EngineConfig(
        scheduler=sched, cache=CacheConfig(kv_cache_memory_fraction=fraction)))
    assert "KV pool from kv_cache_memory_fraction" in capsys.readouterr().err
    # Free memory moves between the two readings (other processes): within 25%.
    assert 0.75 * want < engine.memory_bound.kv_pool_bytes < 1.25 * want
    engine.close()
    # An explicit byte count wins over the share.
    engine = LLMEngine.from_loaded(tiny_loaded, EngineConfig(scheduler=sched, cache=CacheConfig(
        kv_cache_memory_fraction=fraction, kv_cache_memory_bytes=4 * 2**20)))
    assert engine.memory_bound.kv_pool_bytes <= 4 * 2**20
    engine.close()
    with pytest.raises(ValueError, match="kv_cache_memory_fraction"):
        CacheConfig(kv_cache_memory_fraction=1.5)
