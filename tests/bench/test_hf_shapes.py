"""benchmarks/hf_shapes.py on its tiny shape: a random checkpoint written shard by shard,
converted by llama.cpp's convert_hf_to_gguf.py, quantized by llama-quantize, loaded and run by
cadence. Skipped where the llama.cpp cache is not there."""

from __future__ import annotations

import json

import pytest

from tests.bench.bench_modules import load_benchmark


hf_shapes = load_benchmark("hf_shapes")
CACHE = hf_shapes.llamacpp_cache()
pytestmark = pytest.mark.skipif(
    hf_shapes.converter_script(CACHE) is None or hf_shapes.quantize_binary(CACHE) is None,
    reason=f"llama.cpp is not in {CACHE} (set CADENCE_LLAMACPP_CACHE; benchmarks/llamacpp_peer.py --build)")


def test_checkpoint_shards_hold_every_tensor_of_the_shape(tmp_path):
    shape = hf_shapes.SHAPES["tiny-llama"]
    total = hf_shapes.write_checkpoint(shape, tmp_path / "ckpt", shard_gib=0.01, seed=0)
    index = json.loads((tmp_path / "ckpt" / "model.safetensors.index.json").read_text())
    names = dict(hf_shapes.tensor_shapes(shape))
    assert set(index["weight_map"]) == set(names)  # tied: no lm_head
    assert len(set(index["weight_map"].values())) >= 2  # 25 MB in shards of ~10 MB
    assert index["metadata"]["total_size"] == total
    assert names["model.layers.0.self_attn.k_proj.weight"] == (shape.kv_heads * shape.head_dim, shape.hidden)


def test_tiny_shape_converts_quantizes_and_generates(tmp_path):
    from cadence import LLM
    from cadence.core.sampling_params import SamplingParams

    files = hf_shapes.build("tiny-llama", ["Q4_K_M", "Q8_0"], tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in files.values())  # no leftovers
    import gguf

    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(files["Q4_K_M"])).tensors}
    assert types["blk.0.attn_q.weight"] == "Q4_K"  # llama-quantize's Q4_K_M layout
    assert {t.tensor_type.name for t in gguf.GGUFReader(str(files["Q8_0"])).tensors} >= {"Q8_0"}
    llm = LLM(model=str(files["Q4_K_M"]), num_gpu_blocks_override=32, startup_profile=False)
    out = llm.generate(["Hello"], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3
