"""An engine that owns an int8 / int4 model gives back the float32 copies of its GEMM weights
once the fused stack's packed weights serve every CPU path (LlamaForCausalLM.
release_float_weights): greedy tokens stay those of an engine that kept them, the memory goes,
and what would still need the float32 weights refuses with a clear error."""

from __future__ import annotations

import pytest
import torch

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.sampling_params import SamplingParams
from cadence.engine.config import EngineConfig
from cadence.engine.llm_engine import LLMEngine
from cadence.engine.memory_bound import model_bytes
from cadence.model.fused_decode import has_f32_stack
from cadence.model.kernels.cpu_ops import load_cpu_kernels
from cadence.model.loader import load_model

KERNELS = load_cpu_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None or not has_f32_stack(KERNELS),
                                reason="needs the CPU kernels' float32 stack (AVX2 + FMA)")

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def _config(model_dir: str, fmt: str) -> EngineConfig:
    # Budget 48: the long prompt runs in chunks through the per-op path (over the stack's 32
    # tokens), the short one and the decode steps through the stack.
    return EngineConfig(model=model_dir, dtype="float32", device="cpu", quantization=fmt,
                        scheduler=SchedulerConfig(policy="chunked", max_num_batched_tokens=48),
                        cache=CacheConfig(num_blocks=64), startup_profile=False)


def _run(engine: LLMEngine, prompts: list[list[int]]) -> dict[str, list[int]]:
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{i}", ids, GREEDY)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.req_id, []).extend(out.new_token_ids)
    return tokens


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_owned_integer_model_releases_its_float32_weights(tiny_llama_d64_dir, fmt):
    prompts = [[3 + (7 * i) % 200 for i in range(100)], [5, 9, 11, 13, 17]]
    kept = load_model(tiny_llama_d64_dir, dtype="float32", device="cpu", quantization=fmt)
    before = model_bytes(kept.model)
    reference = _run(LLMEngine.from_loaded(kept, _config(tiny_llama_d64_dir, fmt)), prompts)
    assert not kept.model._float_weights_released  # a borrowed model keeps its weights

    engine = LLMEngine(_config(tiny_llama_d64_dir, fmt))
    model = engine.executor.model
    assert model._float_weights_released
    layer = model.model.layers[0]
    assert layer.self_attn.q_proj.weight.numel() == 0 and layer.mlp.down_proj.weight.numel() == 0
    assert layer.self_attn.fused_weight is None
    assert model_bytes(model) < before * 0.6
    assert _run(engine, prompts) == reference
    # What needs the float32 weights says so.
    with pytest.raises(ValueError, match="release_float_weights"):
        model.set_decode_weight_format("float32")
    kv = engine.executor.kv_cache
    with pytest.raises(ValueError, match="pure-torch forward"):
        model.forward(torch.tensor([3]), torch.tensor([0]), None, kv, use_kernels=False)
    engine.close()


def test_float32_model_keeps_its_weights(tiny_llama_d64_dir):
    engine = LLMEngine(_config(tiny_llama_d64_dir, "none"))
    model = engine.executor.model
    assert not model._float_weights_released
    assert model.model.layers[0].self_attn.q_proj.weight.numel() > 0
    engine.close()
