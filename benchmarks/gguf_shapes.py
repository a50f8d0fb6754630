"""GGUF files of real model shapes with random weights, in a published file's type layout.

Speed and memory at 1B-8B need files of those shapes, not their trained weights: this writes a
llama-architecture GGUF whose tensors have the shapes of Llama-3.2-1B, Llama-3.1-8B or Qwen3-4B
and the ggml types llama-quantize gives a Q4_K_M (or Q8_0) file: Q4_K everywhere, Q6_K for
the output and for attn_v / ffn_down on the layers llama.cpp gives more bits (the first and
last eighth, and every third layer between), F32 norms. Each block is random bytes with its
float16 scales set to small finite values, so every block is valid and dequantizes to finite
numbers; the file is streamed tensor by tensor (an 8B file is ~4.9 GB; nothing of it is held
in memory at once). The tokenizer is the default model's (SmolLM2's BPE) padded with unused
tokens up to the shape's vocabulary. llama.cpp reads these files (llama-bench runs on them).

    .venv/bin/python benchmarks/gguf_shapes.py --shape llama-3.1-8b --out ~/.cache/cadence/shapes
    .venv/bin/python benchmarks/gguf_shapes.py --shape llama-3.2-1b --type Q8_0 --load
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    rope_theta: float
    tied: bool
    context: int = 8192


SHAPES = {
    "llama-3.2-1b": Shape(2048, 8192, 16, 32, 8, 64, 128256, 500000.0, True),
    "llama-3.1-8b": Shape(4096, 14336, 32, 32, 8, 128, 128256, 500000.0, False),
    "qwen3-4b": Shape(2560, 9728, 36, 32, 8, 128, 151936, 1000000.0, True),
}


def _more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers and every third one."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def layer_tensors(shape: Shape) -> list[tuple[str, tuple[int, int] | tuple[int], str]]:
    """(GGUF name, torch-order shape, role) of every tensor; role picks its type."""
    s = shape
    out: list = [("token_embd.weight", (s.vocab, s.hidden), "embd")]
    for i in range(s.layers):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", (s.hidden,), "norm"),
            (p + "attn_q.weight", (s.heads * s.head_dim, s.hidden), "mat"),
            (p + "attn_k.weight", (s.kv_heads * s.head_dim, s.hidden), "mat"),
            (p + "attn_v.weight", (s.kv_heads * s.head_dim, s.hidden), "more" if _more_bits(i, s.layers) else "mat"),
            (p + "attn_output.weight", (s.hidden, s.heads * s.head_dim), "mat"),
            (p + "ffn_norm.weight", (s.hidden,), "norm"),
            (p + "ffn_gate.weight", (s.intermediate, s.hidden), "mat"),
            (p + "ffn_up.weight", (s.intermediate, s.hidden), "mat"),
            (p + "ffn_down.weight", (s.hidden, s.intermediate), "more" if _more_bits(i, s.layers) else "mat"),
        ]
    out.append(("output_norm.weight", (s.hidden,), "norm"))
    if not s.tied:
        out.append(("output.weight", (s.vocab, s.hidden), "output"))
    return out


def type_of(role: str, file_type: str):
    import gguf

    Q = gguf.GGMLQuantizationType
    if role == "norm":
        return Q.F32
    if file_type == "Q8_0":
        return Q.Q8_0
    return Q.Q6_K if role in ("more", "output") else Q.Q4_K


def random_blocks(rng: np.random.Generator, qtype, rows: int, cols: int) -> np.ndarray:
    """[rows, row bytes] uint8 of valid random blocks (float16 scales small and finite)."""
    import gguf

    Q = gguf.GGMLQuantizationType
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n = rows * cols // block
    data = rng.integers(0, 256, size=(n, size), dtype=np.uint8)

    def set_f16(offset: int, low: float, high: float) -> None:
        values = rng.uniform(low, high, size=n).astype(np.float16)
        data[:, offset:offset + 2] = values.view(np.uint8).reshape(n, 2)

    if qtype == Q.Q4_K:  # d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
        set_f16(0, 1e-4, 2e-3)
        set_f16(2, 1e-4, 2e-3)
    elif qtype == Q.Q6_K:  # ql[128], qh[64], int8 scales[16], d
        set_f16(208, 1e-5, 2e-4)
    elif qtype == Q.Q8_0:  # d, 32 int8
        set_f16(0, 1e-4, 1e-3)
    else:
        raise ValueError(f"no random blocks for {qtype.name}")
    return data.reshape(rows, -1)


def tokenizer_fields(vocab: int):
    """The default model's BPE tokenizer metadata, padded to `vocab` tokens."""
    from cadence.model.gguf_fields import GGUFFile, gguf_value
    from cadence.model.loader import default_model_path

    ref = GGUFFile(default_model_path())
    tokens = list(gguf_value(ref, "tokenizer.ggml.tokens", []))
    types = list(gguf_value(ref, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = list(gguf_value(ref, "tokenizer.ggml.merges", []))
    pad = vocab - len(tokens)
    tokens += [f"<unused_{i}>" for i in range(pad)]
    types += [5] * pad  # unused
    return tokens, types, merges, gguf_value(ref, "tokenizer.ggml.eos_token_id", 0), gguf_value(
        ref, "tokenizer.ggml.bos_token_id", 0)


def write(shape_name: str, file_type: str, out_dir: Path, seed: int = 0) -> Path:
    import gguf

    shape = SHAPES[shape_name]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{shape_name}-random-{file_type}.gguf"
    if path.is_file():
        return path
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".partial")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name(f"{shape_name} (random weights)")
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(shape.vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M if file_type == "Q4_K_M" else gguf.LlamaFileType.MOSTLY_Q8_0)
    tokens, types, merges, eos, bos = tokenizer_fields(shape.vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(eos)
    writer.add_bos_token_id(bos)
    plan = []
    for name, tshape, role in layer_tensors(shape):
        qtype = type_of(role, file_type)
        if qtype == gguf.GGMLQuantizationType.F32:
            nbytes = int(np.prod(tshape)) * 4
            writer.add_tensor_info(name, tshape, np.dtype(np.float32), nbytes)
        else:
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            rows, cols = tshape
            nbytes = rows * cols // block * size
            writer.add_tensor_info(name, (rows, cols // block * size), np.dtype(np.uint8), nbytes, raw_dtype=qtype)
        plan.append((name, tshape, qtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, tshape, qtype in plan:
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.write_tensor_data((1.0 + 0.05 * rng.standard_normal(tshape)).astype(np.float32))
        else:
            writer.write_tensor_data(random_blocks(rng, qtype, *tshape))
    writer.close()
    os.replace(tmp, path)
    return path


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def load_and_measure(path: Path, dtype: str, quantization: str) -> None:
    """Load time, RSS, and one short greedy generation of the file."""
    from cadence.model.loader import load_model

    before = rss_mib()
    start = time.perf_counter()
    loaded = load_model(str(path), dtype=dtype, device="cpu", quantization=quantization)
    load_s = time.perf_counter() - start
    print(f"load: {load_s:.1f} s ({getattr(loaded.model, 'decode_weight_format', '?')} weights); "
          f"RSS {before:.0f} -> {rss_mib():.0f} MiB; file {path.stat().st_size / 2**20:.0f} MiB")
    import torch

    from cadence.model.attention_metadata import AttentionMetadata
    from cadence.model.kv_cache import KVCache

    # A 32-token prompt, then 4 decode steps: every matrix is read (the file's pages come in).
    block, blocks = 16, 4
    kv = KVCache(loaded.config, blocks, block, loaded.dtype, "cpu")
    table = list(range(blocks))
    ids = list(range(100, 132))
    with torch.inference_mode():
        start = time.perf_counter()
        meta = AttentionMetadata.build([(0, len(ids), table)], block, blocks)
        hidden = loaded.model(torch.tensor(ids), meta.positions, meta, kv)
        token = int(loaded.model.compute_logits(hidden[-1:]).argmax())
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        for pos in range(len(ids), len(ids) + 4):
            meta = AttentionMetadata.build([(pos, 1, table)], block, blocks)
            hidden = loaded.model(torch.tensor([token]), meta.positions, meta, kv)
            token = int(loaded.model.compute_logits(hidden).argmax())
        decode_s = (time.perf_counter() - start) / 4
    kv_mib = kv.storage.numel() * kv.storage.element_size() / 2**20
    print(f"prefill 32 tokens {prefill_s:.2f} s, decode {decode_s * 1e3:.0f} ms/token; RSS {rss_mib():.0f} MiB "
          f"(KV {kv_mib:.0f} MiB)")
    del loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-1b")
    parser.add_argument("--type", choices=("Q4_K_M", "Q8_0"), default="Q4_K_M")
    parser.add_argument("--out", default=str(Path.home() / ".cache" / "cadence" / "shapes"))
    parser.add_argument("--load", action="store_true", help="load it with cadence and report time and RSS")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default="auto",
                        help="auto computes a Q4_K_M file from its own blocks (gguf)")
    args = parser.parse_args()
    start = time.perf_counter()
    path = write(args.shape, args.type, Path(args.out).expanduser())
    print(f"{path} ({path.stat().st_size / 2**30:.2f} GiB) ready in {time.perf_counter() - start:.0f} s")
    if args.load:
        load_and_measure(path, args.dtype, args.quantization)


if __name__ == "__main__":
    main()
