"""Every model family loaded from its HF folder gives transformers' float32 logits and greedy
tokens, on the compiled-kernel path and the pure-torch path, whatever the chunking and
batching (tiny random checkpoints of tests/model/family_checkpoints.py; prompts longer than
the sliding windows)."""

from __future__ import annotations

import random

import pytest
import torch

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.sampling_params import SamplingParams
from cadence.engine.config import EngineConfig
from cadence.engine.llm import LLM
from cadence.engine.llm_engine import LLMEngine
from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.fused_decode import WEIGHT_FORMATS, has_f32_stack
from cadence.model.kernels.cpu_ops import load_cpu_kernels
from cadence.model.kv_cache import KVCache
from cadence.model.loader import load_model
from cadence.model.moe import layer_mlps

from .family_checkpoints import FAMILIES, WINDOW, build_family_checkpoint
from .paged_helpers import scattered_block_table

TOLERANCE = 1e-4
PROMPT_LEN = 40  # > WINDOW: the windows exclude keys
NUM_TOKENS = 12
PROMPTS = [
    "Continuous batching mixes prefill chunks with decode steps under a token budget.",
    "The quick brown fox jumps over the lazy dog. Hello world!",
    "Paged attention stores keys and values in fixed-size blocks. def forward(self, x):",
]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    """(name, folder, cadence LoadedModel fp32, transformers model fp32)."""
    import transformers

    path = build_family_checkpoint(str(tmp_path_factory.mktemp(request.param)), request.param)
    ours = load_model(path, dtype="float32", device="cpu")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return request.param, path, ours, theirs


def hf_logits(model, token_ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([token_ids])).logits[0].float()


def random_prompt(vocab: int, length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(length)]


def paged_logits(loaded, token_ids: list[int], chunk: int, use_kernels: bool) -> torch.Tensor:
    """Logits [len, V] computed chunk by chunk through a paged cache of scattered blocks."""
    block_size, pool = 4, 64
    kv = KVCache(loaded.config, pool, block_size, loaded.dtype, loaded.device)
    table = scattered_block_table(-(-len(token_ids) // block_size), pool, seed=chunk)
    rows = []
    with torch.inference_mode():
        for start in range(0, len(token_ids), chunk):
            piece = token_ids[start:start + chunk]
            meta = AttentionMetadata.build([(start, len(piece), table)], block_size, pool)
            hidden = loaded.model(torch.tensor(piece), meta.positions, meta, kv, use_kernels=use_kernels)
            rows.append(loaded.model.compute_logits(hidden))
    return torch.cat(rows)


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "torch"])
@pytest.mark.parametrize("chunk", [1000, 1, 7])
def test_logits_match_transformers(family, chunk, use_kernels):
    name, _, ours, theirs = family
    prompt = random_prompt(ours.config.vocab_size, PROMPT_LEN, seed=chunk)
    expected = hf_logits(theirs, prompt)
    got = paged_logits(ours, prompt, chunk, use_kernels)
    diff = (got - expected).abs().max().item()
    assert diff < TOLERANCE, f"{name}: max abs diff {diff} (chunk {chunk}, kernels {use_kernels})"


def test_contexts_within_the_window_match_transformers(family, monkeypatch):
    """Sequences no longer than the window take the compiled attention on windowed layers (the
    torch attention only serves soft-capped layers then)."""
    import cadence.model.llama as llama

    name, _, ours, theirs = family
    torch_calls = []
    real = llama.cached_attention
    monkeypatch.setattr(llama, "cached_attention", lambda *a: torch_calls.append(1) or real(*a))
    prompt = random_prompt(ours.config.vocab_size, WINDOW, seed=11)
    expected = hf_logits(theirs, prompt)
    for chunk in (WINDOW, 3, 1):
        diff = (paged_logits(ours, prompt, chunk, True) - expected).abs().max().item()
        assert diff < TOLERANCE, f"{name}: max abs diff {diff} (chunk {chunk})"
    if load_cpu_kernels() is not None:
        assert bool(torch_calls) == (ours.config.attn_logit_softcapping is not None)


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "torch"])
def test_mixed_batch_matches_transformers(family, use_kernels):
    """One forward of two prefill chunks (one continuing past the window) and three decodes."""
    name, _, ours, theirs = family
    block_size, pool = 4, 96
    prompts = [random_prompt(ours.config.vocab_size, n, seed=n) for n in (23, 21, 31, 5, 14)]
    split = [(0, 23), (12, 9), (30, 1), (4, 1), (13, 1)]  # (cached, new) per sequence
    kv = KVCache(ours.config, pool, block_size, ours.dtype, ours.device)
    blocks = scattered_block_table(pool, pool, seed=3)
    tables, cursor = [], 0
    for p in prompts:
        need = -(-len(p) // block_size)
        tables.append(blocks[cursor:cursor + need])
        cursor += need
    model = ours.model
    with torch.inference_mode():
        for p, (cached, _), table in zip(prompts, split, tables):
            if cached:
                meta = AttentionMetadata.build([(0, cached, table)], block_size, pool)
                model(torch.tensor(p[:cached]), meta.positions, meta, kv, use_kernels=use_kernels)
        meta = AttentionMetadata.build([(c, n, t) for (c, n), t in zip(split, tables)], block_size, pool)
        ids = torch.tensor([t for p, (c, n) in zip(prompts, split) for t in p[c:c + n]])
        got = model.compute_logits(model(ids, meta.positions, meta, kv, use_kernels=use_kernels))
    row = 0
    for p, (cached, new) in zip(prompts, split):
        diff = (got[row:row + new] - hf_logits(theirs, p)[cached:cached + new]).abs().max().item()
        assert diff < TOLERANCE, f"{name}: sequence of {len(p)} tokens: max abs diff {diff}"
        row += new


def engine_tokens(loaded, prompts, policy, budget, max_seqs, prefix, block_size=4):
    cfg = EngineConfig(
        scheduler=SchedulerConfig(policy=policy, max_num_batched_tokens=budget, max_num_seqs=max_seqs),
        cache=CacheConfig(block_size=block_size, num_blocks=256, enable_prefix_caching=prefix),
    )
    engine = LLMEngine.from_loaded(loaded, cfg)
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    results = LLM.from_engine(engine).generate(prompts, params)
    engine.scheduler.check_integrity()
    return [list(r.outputs[0].token_ids) for r in results]


def hf_greedy(model, prompt_ids: list[int]) -> list[int]:
    ids = list(prompt_ids)
    with torch.inference_mode():
        for _ in range(NUM_TOKENS):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids):]


def test_greedy_tokens_match_transformers_and_scheduling(family):
    """The engine's greedy tokens equal transformers' (full recompute per token), and stay the
    same when prompts are chunked, batched together and share cached prefixes (invariant 1)."""
    name, _, ours, theirs = family
    prompts = PROMPTS + [PROMPTS[0] + " The quick brown fox"]  # a shared prefix
    assert all(len(ours.tokenizer.encode(p)) > WINDOW for p in prompts)
    reference = engine_tokens(ours, prompts, "eager", 8192, 1, prefix=False)
    assert reference == [hf_greedy(theirs, ours.tokenizer.encode(p)) for p in prompts], name
    for policy, budget, max_seqs, prefix in [("chunked", 16, 4, True), ("chunked", 5, 64, False)]:
        got = engine_tokens(ours, prompts, policy, budget, max_seqs, prefix)
        assert got == reference, f"{name}: {policy} budget {budget} max_seqs {max_seqs} prefix {prefix}"


def test_only_stack_shaped_families_take_the_fused_stack(family):
    """Plain Llama (and Qwen3 without a window, whose q/k norms the stacks have:
    test_fused_decode.py, test_fused_decode_f32.py) take the stack; every other family runs the
    per-op path."""
    name, _, ours, _ = family
    kernels = load_cpu_kernels()
    if kernels is None:
        pytest.skip("compiled CPU kernels unavailable")
    stack = ours.model._stack_for(kernels)
    if not ours.config.stack_computes():
        assert stack is False, f"{name} must run the per-op path"
        if has_f32_stack(kernels):  # its GEMMs packed for the float32 kernels instead
            layer = ours.model.model.layers[0]
            assert layer.self_attn.packed is not None
            for mlp in layer_mlps(layer):  # the dense MLP, or each expert of an MoE layer
                assert mlp.packed is not None and not mlp.packed_interleaved
    elif has_f32_stack(kernels):
        assert stack, f"{name} (plain Llama, head_dim {ours.config.head_dim}) should take the stack"


def test_windows_and_caps_matter(family):
    """The tiny checkpoints exercise their pieces: without its window (or soft-caps) the
    transformers model gives other logits over the prompt."""
    import transformers

    name, path, ours, theirs = family
    cfg = ours.config
    if cfg.sliding_window is None and cfg.attn_logit_softcapping is None:
        pytest.skip(f"{name} has no window or soft-cap")
    config = transformers.AutoConfig.from_pretrained(path)
    if cfg.sliding_window is not None:
        config.sliding_window = 10**6
    if cfg.attn_logit_softcapping is not None:
        config.attn_logit_softcapping = None
    plain = transformers.AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch.float32).eval()
    prompt = random_prompt(cfg.vocab_size, PROMPT_LEN, seed=1)
    assert (hf_logits(plain, prompt) - hf_logits(theirs, prompt)).abs().max().item() > 1e-2


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_integer_storage_runs_the_per_op_path(family, quantization):
    """--quantization int8 / int4 on a non-plain family: per-op GEMMs on the packed integer
    weights with quantized inputs; scheduling still does not change the greedy tokens."""
    name, path, _, _ = family
    if name not in ("gemma2", "phi3", "qwen3_moe"):
        pytest.skip("representative non-plain families (Qwen3-MoE: each expert packed)")
    loaded = load_model(path, dtype="float32", device="cpu", quantization=quantization)
    assert loaded.model.decode_weight_format == quantization
    kernels = load_cpu_kernels()
    if kernels is not None and has_f32_stack(kernels):
        loaded.model.prepare_fast_path()
        for mlp in layer_mlps(loaded.model.model.layers[0]):
            assert mlp.packed[0].format == WEIGHT_FORMATS[quantization]
    reference = engine_tokens(loaded, PROMPTS, "eager", 8192, 1, prefix=False)
    assert engine_tokens(loaded, PROMPTS, "chunked", 16, 4, prefix=True) == reference


def test_bfloat16_stays_close_to_float32(family):
    """bf16 compute (the default on CPUs with native bf16): the per-op pieces in bf16."""
    name, path, ours, _ = family
    bf16 = load_model(path, dtype="bfloat16", device="cpu")
    prompt = random_prompt(ours.config.vocab_size, PROMPT_LEN, seed=5)
    ref = paged_logits(ours, prompt, 7, True)
    for use_kernels in (True, False):
        got = paged_logits(bf16, prompt, 7, use_kernels)
        rel = ((got - ref).abs().max() / ref.abs().max()).item()
        assert rel < 0.05, f"{name} bf16 (kernels {use_kernels}): max relative logit error {rel:.4f}"
