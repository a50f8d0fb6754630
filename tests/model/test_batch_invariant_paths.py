"""A prompt's logits and KV are bit-identical however its steps split it (issue 31).

The float32 path with packed weights (int8 / int4: the default storage; float32 after
pin_invariant_gemms, what --deterministic asks) on a tiny head_dim-64 Llama: one 100-token
prompt (sequence A) and its three decodes, run

- as one 100-row step (the per-op path: packed GEMMs, every row through the paged attention),
- in chunks of 16 (the fused decode stack),
- in chunks of 40 next to another prompt's chunks (mixed per-op steps of ~80 rows),

must give the same logits of its last prompt row and decodes and the same K/V, bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.fused_decode import has_f32_stack
from cadence.model.kernels.cpu_ops import load_cpu_kernels
from cadence.model.kv_cache import KVCache
from cadence.model.loader import load_model

KERNELS = load_cpu_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None or not has_f32_stack(KERNELS),
                                reason="needs the CPU kernels built for a tier with AVX2 and FMA")

POOL, BLOCK = 32, 16
_ORDER = torch.randperm(POOL, generator=torch.Generator().manual_seed(7)).tolist()
TABLE_A, TABLE_B = _ORDER[:16], _ORDER[16:]
PROMPT, DECODES, OTHER = 100, 3, 70


def _run(model, config, plan) -> tuple[list[torch.Tensor], torch.Tensor]:
    """plan: steps of [(seq, start, n)]. Returns the logits of A's rows that end its prompt or
    decode (in order) and A's K/V slots."""
    gen = torch.Generator().manual_seed(11)
    tokens = {"A": torch.randint(0, config.vocab_size, (PROMPT + DECODES,), generator=gen),
              "B": torch.randint(0, config.vocab_size, (OTHER,), generator=gen)}
    tables = {"A": TABLE_A, "B": TABLE_B}
    kv = KVCache(config, POOL, BLOCK, torch.float32, "cpu")
    kv.storage.zero_()
    logits = []
    with torch.inference_mode():
        for step in plan:
            meta = AttentionMetadata.build([(start, n, tables[s]) for s, start, n in step], BLOCK, POOL)
            ids = torch.cat([tokens[s][start:start + n] for s, start, n in step])
            hidden = model(ids, meta.positions, meta, kv)
            row = 0
            for s, start, n in step:
                row += n
                if s == "A" and start + n >= PROMPT:
                    logits.append(model.compute_logits(hidden[row - 1:row]))
    slots = torch.tensor([TABLE_A[p // BLOCK] * BLOCK + p % BLOCK for p in range(PROMPT + DECODES)])
    layers_kv = kv.storage.flatten(2, 3)[:, :, slots]  # [L, 2, positions, Hkv, D]
    return logits, layers_kv.clone()


def _decodes() -> list[list[tuple[str, int, int]]]:
    return [[("A", PROMPT + i, 1)] for i in range(DECODES)]


PLANS = {
    "whole": [[("A", 0, PROMPT)], *_decodes()],
    "chunks of 16": [[("A", s, min(16, PROMPT - s))] for s in range(0, PROMPT, 16)] + _decodes(),
    "mixed chunks of 40": [[("B", 0, 40), ("A", 0, 40)], [("A", 40, 40), ("B", 40, 30)],
                           [("A", 80, 20)], *_decodes()],
}


@pytest.mark.parametrize("fmt", ["int8", "int4", "float32"])
def test_prompt_results_do_not_depend_on_the_split(tiny_llama_d64_dir, fmt):
    loaded = load_model(tiny_llama_d64_dir, dtype=torch.float32, device="cpu")
    loaded.model.set_decode_weight_format(fmt)
    if fmt == "float32":
        loaded.model.pin_invariant_gemms()
    results = {name: _run(loaded.model, loaded.config, plan) for name, plan in PLANS.items()}
    base_logits, base_kv = results["whole"]
    assert len(base_logits) == 1 + DECODES
    for name, (logits, kv) in results.items():
        assert torch.equal(kv, base_kv), name
        for i, (a, b) in enumerate(zip(logits, base_logits)):
            assert torch.equal(a, b), f"{name}: row {i}"
