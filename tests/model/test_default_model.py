"""The bundled SmolLM2-135M GGUF: our greedy output equals transformers' on the same file."""

from __future__ import annotations

import os

import pytest
import torch

from cadence.executor.model_runner import ModelExecutor
from cadence.model.detokenizer import IncrementalDetokenizer
from cadence.model.loader import load_model

from .paged_helpers import paged_logits
from .runner_helpers import greedy_generate

pytestmark = pytest.mark.slow

NUM_TOKENS = 40
MESSAGES = [{"role": "user", "content": "Write a short story about a robot who learns to paint."}]


@pytest.fixture(scope="module")
def hf_gguf_model(default_model_path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(default_model_path), gguf_file=os.path.basename(default_model_path),
        dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompt_ids(default_fp32):
    tok = default_fp32.tokenizer
    return tok.encode(tok.apply_chat_template(MESSAGES), add_special_tokens=False)


@pytest.fixture(scope="module")
def hf_greedy(hf_gguf_model, prompt_ids):
    with torch.inference_mode():
        out = hf_gguf_model.generate(torch.tensor([prompt_ids]), max_new_tokens=NUM_TOKENS,
                                     do_sample=False)
    return out[0, len(prompt_ids):].tolist()


def test_config_of_default_model(default_fp32):
    c = default_fp32.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (30, 576, 9, 3, 64)
    assert (c.intermediate_size, c.vocab_size, c.max_position_embeddings) == (1536, 49152, 8192)
    assert c.rope_theta == 100000.0 and c.tie_word_embeddings
    assert default_fp32.name == "SmolLM2-135M-Instruct.Q4_1"


def test_greedy_fp32_matches_transformers(default_fp32, prompt_ids, hf_greedy):
    assert len(hf_greedy) >= 32, "prompt must produce at least 32 tokens before EOS"
    executor = ModelExecutor(default_fp32, num_blocks=64, block_size=16)
    ours = greedy_generate(executor, prompt_ids, len(hf_greedy))
    print("text:", repr(default_fp32.tokenizer.decode(ours)))
    assert ours == hf_greedy


def test_chunked_prefill_gives_same_tokens(default_fp32, prompt_ids, hf_greedy):
    executor = ModelExecutor(default_fp32, num_blocks=64, block_size=16)
    assert greedy_generate(executor, prompt_ids, 32, prefill_chunk=7) == hf_greedy[:32]


def test_streamed_output_equals_decode(default_fp32, hf_greedy):
    detok = IncrementalDetokenizer(default_fp32.tokenizer)
    text = "".join(detok.push(t) for t in hf_greedy) + detok.flush()
    assert text == default_fp32.tokenizer.decode(hf_greedy)


def test_bfloat16_agreement_report(default_model_path, prompt_ids, hf_greedy, hf_gguf_model):
    """bf16 drifts from fp32 by design: report how far, and bound it loosely.

    (transformers is no bf16 reference here: its GGUF path keeps weights quantized and runs its
    matmuls in float32 whatever dtype is asked for.)
    """
    bf16 = load_model(default_model_path, dtype="bfloat16", device="cpu")
    executor = ModelExecutor(bf16, num_blocks=64, block_size=16)
    ours = greedy_generate(executor, prompt_ids, len(hf_greedy))
    same_prefix = next((i for i, (a, b) in enumerate(zip(ours, hf_greedy)) if a != b), len(ours))
    # Teacher-forced top-1 agreement over prompt + reference continuation.
    sequence = prompt_ids + hf_greedy
    with torch.inference_mode():
        ref = hf_gguf_model(torch.tensor([sequence])).logits[0]
    got = paged_logits(bf16, sequence, chunk_size=len(sequence), block_size=16, pool_size=64)
    top1 = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    rel = ((got - ref).abs().max() / ref.abs().max()).item()
    print(f"\nbf16 report: greedy prefix equal to fp32 transformers {same_prefix}/{len(hf_greedy)}; "
          f"teacher-forced top-1 agreement with fp32 {top1:.3f} over {len(sequence)} positions; "
          f"max relative logit error {rel:.4f}")
    assert top1 > 0.8
