"""Llama-architecture GGUF files whose matrices are random valid blocks of any ggml type (or
Qwen3 ones: the same layers plus per-head q/k norms).

gguf-py cannot quantize the K-quants, and a model's equivalence does not need trained values:
each matrix is random bytes with its float16 scales set to small finite numbers (so every block
dequantizes to finite values), norms are random float32. `float_twin` writes the same model
with every matrix as the float32 values of those blocks (gguf-py's dequantization): the
reference a native-format model must reproduce.
"""

from __future__ import annotations

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
# Byte offsets of each type's float16 scale fields inside a block (d, and dmin where present).
_F16_FIELDS = {
    Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,), Q.IQ4_NL: (0,),
    Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.IQ4_XS: (0,),
}
# d per type so that the weights' spread is ~0.05 (random int8 / 6-bit sub-scales multiply it).
_SCALE = {Q.Q4_0: 1e-2, Q.Q4_1: 1e-2, Q.Q5_0: 5e-3, Q.Q5_1: 5e-3, Q.Q8_0: 7e-4, Q.IQ4_NL: 7e-4,
          Q.Q4_K: 2e-4, Q.Q5_K: 1e-4, Q.Q6_K: 4e-5, Q.Q2_K: 5e-3, Q.Q3_K: 1.2e-3, Q.IQ4_XS: 4e-5}


def random_matrix(rng: np.random.Generator, qtype: Q, rows: int, cols: int) -> np.ndarray:
    """[rows, row bytes] uint8 (quantized types) or [rows, cols] float (F32/F16/BF16 as uint8
    rows for BF16) of valid random blocks."""
    if qtype == Q.F32:
        return (0.05 * rng.standard_normal((rows, cols))).astype(np.float32)
    if qtype == Q.F16:
        return (0.05 * rng.standard_normal((rows, cols))).astype(np.float16)
    if qtype == Q.BF16:
        values = (0.05 * rng.standard_normal((rows, cols))).astype(np.float32)
        return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n = rows * cols // block
    data = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    scale = _SCALE[qtype]
    for offset in _F16_FIELDS[qtype]:
        values = rng.uniform(0.2 * scale, scale, size=n).astype(np.float16)
        data[:, offset:offset + 2] = values.view(np.uint8).reshape(n, 2)
    return data.reshape(rows, -1)


def _dequantized(qtype: Q, data: np.ndarray, cols: int) -> np.ndarray:
    if qtype in (Q.F32, Q.F16):
        return data.astype(np.float32)
    return gguf.quants.dequantize(data, qtype).reshape(data.shape[0], cols).astype(np.float32)


def _byte_level_vocab(vocab: int) -> tuple[list[str], list[str]]:
    """A GPT-2 style byte-level vocabulary: the 256 byte characters, then merged pairs."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    pairs = [(a, b) for a in alphabet[:32] for b in alphabet[:32]][:max(0, vocab - len(alphabet))]
    tokens = alphabet + [a + b for a, b in pairs]
    return tokens + [f"<unused{i}>" for i in range(vocab - len(tokens))], [f"{a} {b}" for a, b in pairs]


def _tensors(hidden: int, inter: int, layers: int, heads: int, kv_heads: int, vocab: int, qk_norm: bool):
    head_dim = hidden // heads
    out = [("token_embd.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"blk.{i}."
        if qk_norm:
            out += [(p + "attn_q_norm.weight", (head_dim,)), (p + "attn_k_norm.weight", (head_dim,))]
        out += [(p + "attn_norm.weight", (hidden,)), (p + "attn_q.weight", (heads * head_dim, hidden)),
                (p + "attn_k.weight", (kv_heads * head_dim, hidden)),
                (p + "attn_v.weight", (kv_heads * head_dim, hidden)),
                (p + "attn_output.weight", (hidden, heads * head_dim)), (p + "ffn_norm.weight", (hidden,)),
                (p + "ffn_gate.weight", (inter, hidden)), (p + "ffn_up.weight", (inter, hidden)),
                (p + "ffn_down.weight", (hidden, inter))]
    out += [("output_norm.weight", (hidden,)), ("output.weight", (vocab, hidden))]
    return out


def write_random_gguf(path: str, qtype: Q, *, hidden: int = 256, inter: int = 512, layers: int = 2,
                      heads: int = 4, kv_heads: int = 2, vocab: int = 512, seed: int = 0,
                      float_twin: str | None = None, type_of: dict[str, Q] | None = None,
                      arch: str = "llama") -> str:
    """A llama GGUF whose matrices are `qtype` blocks; with `float_twin`, also that path's file
    holding the same model with every matrix as float32 (its dequantized values). `type_of`
    gives some tensors another type, by the GGUF name's last part before ".weight" (e.g.
    {"attn_v": Q.Q6_K, "ffn_down": Q.Q6_K}, a Q4_K_M file's mix). arch "qwen3": a Qwen3 file
    (per-head q/k norm weights in every layer, rope base 1e6)."""
    assert arch in ("llama", "qwen3"), arch
    rng = np.random.default_rng(seed)
    writers = [gguf.GGUFWriter(path, arch)]
    if float_twin:
        writers.append(gguf.GGUFWriter(float_twin, arch))
    tokens, merges = _byte_level_vocab(vocab)
    for w in writers:
        w.add_block_count(layers)
        w.add_context_length(1024)
        w.add_embedding_length(hidden)
        w.add_feed_forward_length(inter)
        w.add_head_count(heads)
        w.add_head_count_kv(kv_heads)
        w.add_rope_dimension_count(hidden // heads)
        w.add_layer_norm_rms_eps(1e-5)
        if arch == "qwen3":
            w.add_rope_freq_base(1e6)
        w.add_vocab_size(vocab)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types([1] * vocab)
        w.add_token_merges(merges)
        w.add_bos_token_id(0)
        w.add_eos_token_id(1)
    for name, shape in _tensors(hidden, inter, layers, heads, kv_heads, vocab, arch == "qwen3"):
        if len(shape) == 1:
            values = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            for w in writers:
                w.add_tensor(name, values)
            continue
        rows, cols = shape
        ttype = (type_of or {}).get(name.split(".")[-2], qtype)
        data = random_matrix(rng, ttype, rows, cols)
        if ttype in (Q.F32, Q.F16):
            writers[0].add_tensor(name, data)
        else:
            writers[0].add_tensor(name, data, raw_shape=data.shape, raw_dtype=ttype)
        if float_twin:
            writers[1].add_tensor(name, _dequantized(ttype, data, cols))
    for w in writers:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return path
