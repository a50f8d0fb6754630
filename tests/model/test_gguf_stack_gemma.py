"""The GGUF decode stack on Gemma layers (kernels.DecodeStackGGUF with gguf_stack's family pieces):
sandwich norms, GeGLU, sliding-window layers on their own rope base, the query_pre_attn_scalar
scale and the embedding multiplier (applied before the stack).

Tiny random Gemma checkpoints with head_dim 64 (the stack's attention takes 64 / 128 / 256),
written as llama.cpp's converter writes them, windows of 8 positions: the contexts run past the
window and past the 256-position span of the attention kernel (a window that starts in the
second span). The stack must give the per-op path's bits (logits and the KV it writes; greedy
tokens), and with float32 weights the logits of transformers.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.fused_decode import ENV_SWITCH
from cadence.model.kernels.cpu_ops import load_cpu_kernels
from cadence.model.kv_cache import KVCache
from cadence.model.loader import load_model
from tests.model.family_checkpoints import save_random_checkpoint

from .gguf_helpers import write_tiny_gguf
from .paged_helpers import paged_logits, scattered_block_table
from .stack_helpers import run_steps

KERNELS = load_cpu_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None or not hasattr(KERNELS, "DecodeStackGGUF")
                                or KERNELS.kernel_tier() not in ("avx2", "avx512", "avx512bf16"),
                                reason="needs the CPU kernels built for a tier with AVX2 and FMA")

WINDOW = 8
POOL, BLOCK = 72, 16
_ORDER = torch.randperm(POOL, generator=torch.Generator().manual_seed(3)).tolist()
TABLES = [_ORDER[24 * i:24 * (i + 1)] for i in range(3)]
# (start, new tokens) per sequence. The stack takes steps of chunks up to 32 tokens: prompt rows
# whose window excludes keys, decodes; the 250-token chunk runs on the per-op path in both runs;
# then decodes and a chunk whose windows start in the attention kernel's second span.
STEPS = [[(0, 17), (0, 9), (0, 3)], [(17, 1), (9, 1), (3, 1)], [(18, 250), (10, 5), (4, 1)],
         [(268, 1), (15, 1), (5, 1)], [(269, 20), (16, 1), (6, 1)], [(289, 1), (17, 12), (7, 1)]]


def _family_configs(vocab: int) -> dict[str, tuple[str, str, dict]]:
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=64, query_pre_attn_scalar=64, sliding_window=WINDOW,
                  max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.1, eos_token_id=2,
                  bos_token_id=None, pad_token_id=0)
    return {
        # Gemma 2 without attention soft-capping (the stack has none: soft-capped layers run per-op);
        # final soft-capping applies after the stack, on the logits.
        "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
                   dict(common, num_hidden_layers=2, attn_logit_softcapping=None, final_logit_softcapping=4.0)),
        # Gemma 3: 5 sliding layers on base 1e4 and a global one on 1e6 (linear scaling 2).
        "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                   dict(common, num_hidden_layers=6,
                        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
    }


FAMILIES = [f for f in _family_configs(400) if f == "gemma2" or hasattr(KERNELS, "DecodeStackGGUF")
            and hasattr(KERNELS.DecodeStackGGUF, "attach_qk_norms")]


@pytest.fixture(scope="module", params=FAMILIES)
def gemma_dir(request, tmp_path_factory):
    out = str(tmp_path_factory.mktemp(request.param))
    return request.param, save_random_checkpoint(out, request.param, _family_configs)


def _load(hf_dir: str, layer_type=None):
    import gguf

    name = "f32.gguf" if layer_type is None else "q8_0.gguf"
    path = write_tiny_gguf(hf_dir, os.path.join(hf_dir, name),
                           layer_type=None if layer_type is None else gguf.GGMLQuantizationType.Q8_0)
    return load_model(path, dtype="float32", device="cpu", quantization="gguf")


def _run_steps(model, config, stack: bool, monkeypatch):
    """Logits of every step, the final cache, and the stack the decode steps took (None: per-op)."""
    return run_steps(model, config, STEPS, TABLES, BLOCK, POOL, stack, monkeypatch)


def test_gemma_stack_gives_the_per_op_bits(gemma_dir, monkeypatch):
    family, hf_dir = gemma_dir
    loaded = _load(hf_dir, layer_type="q8_0")
    model, config = loaded.model, loaded.config
    assert config.sandwich_norms and config.hidden_act == "gelu_pytorch_tanh" and config.layer_types is not None
    stack_logits, stack_kv, stack = _run_steps(model, config, True, monkeypatch)
    assert isinstance(stack, KERNELS.DecodeStackGGUF) and stack.num_layers == config.num_layers
    per_op_logits, per_op_kv, none = _run_steps(model, config, False, monkeypatch)
    assert none is None
    assert torch.isfinite(stack_logits).all() and stack_logits.abs().max() > 0
    assert torch.equal(stack_kv, per_op_kv)
    assert torch.equal(stack_logits, per_op_logits)


def _greedy(model, config, prompt: list[int], steps: int, stack: bool, monkeypatch) -> list[int]:
    """Greedy tokens after `prompt` (prefilled in chunks of 8, every step one the stack may take),
    decoded as the executor does: forward_logits where it applies, else forward and the head."""
    monkeypatch.setenv(ENV_SWITCH, "1" if stack else "0")
    model._decode_stack = None
    kv = KVCache(config, POOL, BLOCK, torch.float32, "cpu")
    table = scattered_block_table(POOL // 2, POOL, 1)
    ids, fused_steps = list(prompt), 0
    with torch.inference_mode():
        for start in range(0, len(prompt), 8):
            chunk = prompt[start:start + 8]
            meta = AttentionMetadata.build([(start, len(chunk), table)], BLOCK, POOL)
            logits = model.compute_logits(model(torch.tensor(chunk), meta.positions, meta, kv))
        ids.append(int(logits[-1].argmax()))
        for _ in range(steps - 1):
            meta = AttentionMetadata.build([(len(ids) - 1, 1, table)], BLOCK, POOL)
            token = torch.tensor(ids[-1:])
            fused = model.forward_logits(token, meta.positions, meta, kv, torch.tensor([0]))
            if fused is not None:
                fused_steps += 1
                ids.append(int(fused[1][0]))
            else:
                ids.append(int(model.compute_logits(model(token, meta.positions, meta, kv))[0].argmax()))
    assert (fused_steps > 0) == (stack and config.final_logit_softcapping is None)
    return ids[len(prompt):]


def test_gemma_stack_greedy_tokens_equal_the_per_op_paths(gemma_dir, monkeypatch):
    family, hf_dir = gemma_dir
    loaded = _load(hf_dir, layer_type="q8_0")
    model, config = loaded.model, loaded.config
    prompt = [int(t) for t in np.random.default_rng(11).integers(3, config.vocab_size, 20)]
    with_stack = _greedy(model, config, prompt, 40, True, monkeypatch)
    per_op = _greedy(model, config, prompt, 40, False, monkeypatch)
    assert len(set(with_stack)) > 1  # a real continuation, not one repeated token
    assert with_stack == per_op


def test_gemma_stack_matches_transformers(gemma_dir, monkeypatch):
    """Float32 weights: logits of a 40-token prompt in chunks of 5 (every chunk through the stack,
    windows of 8 excluding keys) within 1e-4 of transformers'."""
    import transformers

    family, hf_dir = gemma_dir
    monkeypatch.setenv(ENV_SWITCH, "1")
    loaded = _load(hf_dir)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    prompt = [int(t) for t in np.random.default_rng(7).integers(3, loaded.config.vocab_size, 40)]
    with torch.inference_mode():
        expected = theirs(torch.tensor([prompt])).logits[0].float()
    got = paged_logits(loaded, prompt, chunk_size=5, block_size=BLOCK, pool_size=POOL)
    assert isinstance(loaded.model._decode_stack, KERNELS.DecodeStackGGUF)
    diff = (got - expected).abs().max().item()
    assert diff < 1e-4, f"{family}: max abs diff {diff}"


GEMMA3_FILE = "/work/cache/gemma/gemma-3-270m-q4_k_m.gguf"


def test_real_gemma3_file_takes_the_stack_with_the_per_op_tokens(monkeypatch):
    """Gemma 3 270M Q4_K_M (head_dim 256; Q8_0, Q5_0, Q4_K, Q6_K tensors; its 262144-row head in
    the stack's call): greedy tokens through the stack equal the per-op path's."""
    if not os.path.isfile(GEMMA3_FILE):
        pytest.skip("the Gemma 3 file is only on the development machine")
    loaded = load_model(GEMMA3_FILE, dtype="float32", device="cpu", quantization="gguf")
    model, config = loaded.model, loaded.config
    prompt = loaded.tokenizer.encode("The capital of France is")
    with_stack = _greedy(model, config, prompt, 12, True, monkeypatch)
    assert isinstance(model._decode_stack, KERNELS.DecodeStackGGUF) and model._decode_stack.head_size == 262144
    assert with_stack == _greedy(model, config, prompt, 12, False, monkeypatch)
