"""Quality of each weight storage format against the float32 reference, on a fixed text.

For every format the CPU fast path can store weights in (float32 reference; bf16 and int8 with
float32 compute; bf16 compute where the CPU has native bf16), teacher-forced over the same
tokens: top-1 agreement of the next-token argmax with the float32 reference, and perplexity of
the text (its delta to the reference's). The default model is SmolLM2-135M (a Q4_1 GGUF,
dequantized at load: the float32 reference holds exactly the GGUF's values).

    .venv/bin/python benchmarks/quality_bench.py
    .venv/bin/python benchmarks/quality_bench.py --formats float32 int8 --tokens 512
"""

from __future__ import annotations

import argparse
import math
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from cadence.model.attention_metadata import AttentionMetadata  # noqa: E402
from cadence.model.kernels.isa import describe, native_bf16  # noqa: E402
from cadence.model.kv_cache import KVCache  # noqa: E402
from cadence.model.loader import load_model  # noqa: E402

# A fixed English text (long enough for ~1000 tokens when repeated with variations).
TEXT = (
    "Several people share one model server. Two answers are streaming at a comfortable pace when a "
    "third user pastes a long document and presses send. Processing the whole prompt at once is "
    "large, compute-bound matrix work that builds the key and value cache; the running answers need "
    "small, frequent decode steps that mostly stream weights from memory. A scheduler that mixes the "
    "two makes each phase inherit the other's bottleneck: the streams stall while the document is "
    "read, or the document waits while the streams are served. Chunked prefill splits the prompt "
    "into pieces that fit a token budget, so that every step still carries the running decodes. "
    "Disaggregation moves the prompt to other workers and ships the cache to the decoding ones, at "
    "the cost of moving bytes and deciding, request by request, whether the handoff pays. "
)


def fixed_tokens(loaded, count: int) -> list[int]:
    ids: list[int] = []
    paragraph = 0
    while len(ids) < count:
        ids += loaded.tokenizer.encode(f"Paragraph {paragraph}. " + TEXT)
        paragraph += 1
    return ids[:count]


def teacher_forced_logits(loaded, ids: list[int], chunk: int) -> torch.Tensor:
    """Logits [len(ids), V] of every position, computed in prefill chunks over a paged cache."""
    block = 16
    blocks = -(-len(ids) // block)
    kv = KVCache(loaded.config, blocks, block, loaded.dtype, "cpu")
    table = list(range(blocks))
    out = []
    model = loaded.model
    with torch.inference_mode():
        for start in range(0, len(ids), chunk):
            piece = ids[start:start + chunk]
            meta = AttentionMetadata.build([(start, len(piece), table)], block, blocks)
            hidden = model(torch.tensor(piece), meta.positions, meta, kv)
            out.append(model.compute_logits(hidden).float())
    return torch.cat(out)


def perplexity(logits: torch.Tensor, ids: list[int]) -> float:
    targets = torch.tensor(ids[1:])
    nll = torch.nn.functional.cross_entropy(logits[:-1], targets)
    return math.exp(nll.item())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--chunk", type=int, default=256, help="prefill chunk (tokens per forward)")
    parser.add_argument("--formats", nargs="+", default=None,
                        help="float32, bf16, int8 (float32 compute) and bf16-compute (native bf16 CPUs)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    formats = args.formats or (["float32", "bf16", "int8"] + (["bf16-compute"] if native_bf16() else []))
    print(describe())
    ref_loaded = load_model(args.model, dtype="float32", device="cpu", quantization="none")
    ids = fixed_tokens(ref_loaded, args.tokens)
    reference = teacher_forced_logits(ref_loaded, ids, args.chunk)
    ref_ppl = perplexity(reference, ids)
    ref_top = reference.argmax(-1)
    del ref_loaded
    print(f"{ref_ppl=:.3f} over {len(ids)} tokens (teacher-forced, chunks of {args.chunk})")
    print(f"{'weights':<14} {'compute':<9} {'top-1 agree':>11} {'perplexity':>11} {'delta':>8} {'max |dlogit|':>13}")
    for fmt in formats:
        start = time.perf_counter()
        if fmt == "bf16-compute":
            loaded = load_model(args.model, dtype="bfloat16", device="cpu")
            weights, compute = "bf16", "bf16"
        else:
            loaded = load_model(args.model, dtype="float32", device="cpu",
                                quantization="none" if fmt == "float32" else fmt)
            weights, compute = fmt, "float32"
        logits = teacher_forced_logits(loaded, ids, args.chunk)
        agree = (logits.argmax(-1) == ref_top).float().mean().item()
        ppl = perplexity(logits, ids)
        print(f"{weights:<14} {compute:<9} {agree:>10.2%} {ppl:>11.3f} {ppl - ref_ppl:>+8.3f} "
              f"{(logits - reference).abs().max().item():>13.3f}   ({time.perf_counter() - start:.0f} s)")
        del loaded


if __name__ == "__main__":
    main()
