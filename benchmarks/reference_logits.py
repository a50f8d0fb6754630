"""Who computes a GGUF file right: cadence and llama.cpp against an exact float64 reference.

The reference dequantizes the file's tensors (gguf's own `dequantize`: the values the blocks
stand for) and runs the decoder's math in float64 (torch), one layer at a time over every
chunk, so memory holds one layer's weights (float64) and the chunks' activations, never the
whole model widened. It follows llama.cpp's graph for the file's architecture: `llama` (rope on
adjacent pairs of the converter's permuted q/k rows, rope_freqs factors where the file has
them) and `qwen3` (per-head RMS norms of q and k before a NEOX rope); other architectures raise.

The three see the same token ids: llama-perplexity's chunks (--ctx tokens each, BOS in place
of the first only where the vocabulary adds one, as llama_vocab_get_add_bos says) and its
scored half, logits at positions ctx/2 .. ctx-2. llama.cpp's log-probabilities come from
`llama-perplexity --kl-divergence-base` (its 16-bit encoding: 16/65535 nats resolution,
ranks below max-16 clipped: the KL it gives is llama.cpp's own --kl-divergence's). For each
of cadence and llama.cpp it prints PPL, mean KL(reference || it), top-1 agreement, and for
cadence the relative error of the residual stream after each layer (its per-op path, hooked).

    PYTHONPATH=src .venv/bin/python benchmarks/reference_logits.py --model FILE.gguf --ctx 128 --chunks 2
"""

from __future__ import annotations

import argparse
import math
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp_peer  # noqa: E402
from perplexity_vs_llamacpp import chunk_bos, chunk_tokens, fixed_text, llamacpp_env  # noqa: E402


class GGUFTensors:
    """A GGUF file's metadata and its tensors dequantized on demand (float32 numpy, [out, in])."""

    def __init__(self, path: str):
        import gguf

        self.reader = gguf.GGUFReader(path)
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.arch = self.value("general.architecture")

    def value(self, key: str, default=None):
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def arch_value(self, key: str, default=None):
        return self.value(f"{self.arch}.{key}", default)

    def has(self, name: str) -> bool:
        return name in self.tensors

    def get(self, name: str, dtype=None):
        """The tensor's values [out, in], float64 (or `dtype`)."""
        import torch
        from gguf import quants

        t = self.tensors[name]
        data = quants.dequantize(np.asarray(t.data), t.tensor_type)
        shape = tuple(int(d) for d in reversed(t.shape))  # ggml's ne0 is the innermost (input) dim
        return torch.from_numpy(np.array(data, dtype=np.float32).reshape(shape)).to(dtype or torch.float64)


def _rms_norm(x, weight, eps: float):
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * weight


def _rope(x, positions, base: float, factors, neox: bool):
    """x [C, T, heads, D] rotated by position; neox: pairs (i, i + D/2), else (2i, 2i + 1)."""
    import torch

    dim = x.shape[-1]
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # [D/2]
    if factors is not None:
        inv = inv / factors
    angle = positions.double()[:, None] * inv[None, :]  # [T, D/2]
    cos, sin = angle.cos()[None, :, None, :], angle.sin()[None, :, None, :]
    if neox:
        a, b = x[..., : dim // 2], x[..., dim // 2:]
    else:
        a, b = x[..., 0::2], x[..., 1::2]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    if neox:
        return torch.cat([ra, rb], dim=-1)
    return torch.stack([ra, rb], dim=-1).flatten(-2)


def reference_logits(model: GGUFTensors, chunks, first: int, keep_layers: bool = True):
    """chunks: int64 [C, T] token ids -> (log-probs float64 [C, T - 1 - first, V] of the scored
    rows, residual stream after each layer [L] of float64 [C, T, H])."""
    import torch

    if model.arch not in ("llama", "qwen3"):
        raise ValueError(f"no reference for architecture {model.arch!r} (llama, qwen3)")
    neox = model.arch == "qwen3"
    heads, kv_heads = model.arch_value("attention.head_count"), model.arch_value("attention.head_count_kv")
    eps = float(model.arch_value("attention.layer_norm_rms_epsilon"))
    base = float(model.arch_value("rope.freq_base", 10000.0))
    factors = model.get("rope_freqs.weight") if model.has("rope_freqs.weight") else None
    layers = model.arch_value("block_count")
    t = chunks.shape[1]
    embed = model.get("token_embd.weight", torch.float32)  # [V, H]
    x = embed[chunks].double()  # [C, T, H]
    del embed
    positions = torch.arange(t)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    residuals = []
    for i in range(layers):
        w = lambda n: model.get(f"blk.{i}.{n}.weight")  # noqa: E731
        h = _rms_norm(x, w("attn_norm"), eps)
        q = (h @ w("attn_q").T).unflatten(-1, (heads, -1))  # [C, T, Hq, D]
        k = (h @ w("attn_k").T).unflatten(-1, (kv_heads, -1))  # [C, T, Hkv, D]
        v = (h @ w("attn_v").T).unflatten(-1, (kv_heads, -1))
        if model.has(f"blk.{i}.attn_q_norm.weight"):
            q, k = _rms_norm(q, w("attn_q_norm"), eps), _rms_norm(k, w("attn_k_norm"), eps)
        q, k = _rope(q, positions, base, factors, neox), _rope(k, positions, base, factors, neox)
        group = heads // kv_heads
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)  # [C, T, Hq, D]
        scores = torch.einsum("cqhd,ckhd->chqk", q, k) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        attn = torch.einsum("chqk,ckhd->cqhd", scores, v).flatten(-2)  # [C, T, Hq*D]
        x = x + attn @ w("attn_output").T
        h = _rms_norm(x, w("ffn_norm"), eps)
        gate, up = h @ w("ffn_gate").T, h @ w("ffn_up").T
        x = x + (torch.nn.functional.silu(gate) * up) @ w("ffn_down").T
        if keep_layers:
            residuals.append(x.clone())
    h = _rms_norm(x[:, first:t - 1], model.get("output_norm.weight"), eps)  # [C, S, H]
    head = model.get("output.weight" if model.has("output.weight") else "token_embd.weight", torch.float32)
    # [V, H] in slices: a 150k x 2560 head is 3 GiB in float64
    logits = torch.cat([h @ head[s:s + 16384].double().T for s in range(0, head.shape[0], 16384)], dim=-1)
    return logits.log_softmax(-1), residuals


def cadence_logits(loaded, chunks, first: int, prefill_chunk: int):
    """cadence's log-probs [C, T - 1 - first, V] (float64 of its float32 logits) and residual
    stream after each layer [L] of [C, T, H] (the per-op path's in-place residual, captured)."""
    import torch

    from cadence.model.attention_metadata import AttentionMetadata
    from cadence.model.kv_cache import KVCache

    layers = loaded.model.model.layers
    captured: list = []
    originals = [layer.forward_cpu for layer in layers]

    def hooked(layer, original):
        def forward_cpu(normed, residual, *args, **kwargs):
            out = original(normed, residual, *args, **kwargs)
            captured.append(residual.detach().double().clone())
            return out
        return forward_cpu

    for layer, original in zip(layers, originals):
        layer.forward_cpu = hooked(layer, original)
    block = 16
    t = chunks.shape[1]
    blocks = -(-t // block)
    out, residuals = [], []
    try:
        with torch.inference_mode():
            for row in chunks.tolist():
                kv = KVCache(loaded.config, blocks, block, loaded.dtype, "cpu")
                table = list(range(blocks))
                hidden, per_layer = [], [[] for _ in layers]
                for start in range(0, t, prefill_chunk):
                    piece = row[start:start + prefill_chunk]
                    meta = AttentionMetadata.build([(start, len(piece), table)], block, blocks)
                    captured.clear()
                    hidden.append(loaded.model(torch.tensor(piece), meta.positions, meta, kv))
                    if len(captured) != len(layers):
                        raise RuntimeError("cadence took a path without per-layer hooks (the fused stack)")
                    for i, r in enumerate(captured):
                        per_layer[i].append(r)
                h = torch.cat(hidden)[first:t - 1]
                out.append(loaded.model.compute_logits(h).double().log_softmax(-1))
                residuals.append([torch.cat(p) for p in per_layer])
    finally:
        for layer in layers:
            del layer.forward_cpu
    per_layer = [torch.stack([r[i] for r in residuals]) for i in range(len(layers))]
    return torch.stack(out), per_layer


def llamacpp_logprobs(gguf: str, text_file: str, ctx: int, chunks: int, threads: int, extra=()):
    """(token ids [C, T] llama.cpp scored, its log-probs float64 [C, T - 1 - ctx/2, V])."""
    import torch

    binary = llamacpp_peer.binary("llama-perplexity")
    if binary is None:
        raise FileNotFoundError("llama-perplexity not built (benchmarks/llamacpp_peer.py --build)")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.bin"
        done = subprocess.run([str(binary), "-m", gguf, "-f", text_file, "-c", str(ctx), "-b", str(ctx),
                               "--chunks", str(chunks), "-t", str(threads), "--kl-divergence-base", str(base),
                               *extra], capture_output=True, text=True, env=llamacpp_env())
        if done.returncode != 0:
            raise RuntimeError(f"llama-perplexity failed: {(done.stdout + done.stderr)[-2000:]}")
        raw = base.read_bytes()
    assert raw[:8] == b"_logits_"
    n_ctx, n_vocab, n_chunk = struct.unpack_from("<iii", raw, 8)
    offset = 20
    tokens = np.frombuffer(raw, dtype=np.int32, count=n_chunk * n_ctx, offset=offset).reshape(n_chunk, n_ctx)
    offset += tokens.nbytes
    nv = 2 * ((n_vocab + 1) // 2) + 4
    rows = n_ctx - 1 - n_ctx // 2
    records = np.frombuffer(raw, dtype=np.uint16, count=n_chunk * rows * nv, offset=offset)
    records = records.reshape(n_chunk, rows, nv)
    head = records[..., :4].copy().view(np.float32)  # [C, S, 2]: scale, min log-prob
    values = records[..., 4:4 + n_vocab].astype(np.float64)
    logprobs = head[..., 1:2].astype(np.float64) + head[..., 0:1].astype(np.float64) * values
    return torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(logprobs)


def compare(name: str, ref, theirs, targets) -> str:
    """PPL, mean KL(ref || theirs) over the scored rows, top-1 agreement with the reference."""
    nll = -theirs.gather(-1, targets[..., None]).mean().item()
    kl = (ref.exp() * (ref - theirs)).sum(-1)
    top1 = (ref.argmax(-1) == theirs.argmax(-1)).double().mean().item()
    return (f"{name:<22} PPL {math.exp(nll):12.2f}  KL(ref||it) mean {kl.mean().item():.2e} "
            f"max {kl.max().item():.2e}  top-1 = ref {100 * top1:5.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="GGUF file (llama or qwen3 architecture)")
    parser.add_argument("--ctx", type=int, default=128)
    parser.add_argument("--chunks", type=int, default=2)
    parser.add_argument("--prefill-chunk", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quantization", default="gguf", help="cadence's --quantization (gguf: the file's blocks)")
    parser.add_argument("--no-llamacpp", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import torch

    from cadence.model.loader import load_model

    torch.set_num_threads(args.threads)
    text = fixed_text(args.ctx * args.chunks * 6)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write(text)
        text_file = f.name
    loaded = load_model(args.model, dtype="float32", device="cpu", quantization=args.quantization)
    first = args.ctx // 2
    results = {}
    if not args.no_llamacpp:
        for label, extra in (("llama.cpp defaults", ()), ("llama.cpp -fa off", ("-fa", "off"))):
            ids, results[label] = llamacpp_logprobs(args.model, text_file, args.ctx, args.chunks,
                                                    args.threads, extra)
    else:
        ids = torch.tensor(loaded.tokenizer.encode(text, add_special_tokens=True)[:args.ctx * args.chunks])
        ids = ids.view(args.chunks, args.ctx)
    os.unlink(text_file)
    bos = chunk_bos(loaded.tokenizer)
    chunks = torch.tensor([chunk_tokens(ids.flatten().tolist(), args.ctx, c, bos) for c in range(args.chunks)])
    print(f"{args.model}: {loaded.config.architecture}, {args.chunks} chunks of {args.ctx}, "
          f"BOS first: {bos is not None}")
    ours, our_layers = cadence_logits(loaded, chunks, first, args.prefill_chunk)
    model = GGUFTensors(args.model)
    ref, ref_layers = reference_logits(model, chunks, first)
    targets = chunks[:, first + 1:]
    vocab = ref.shape[-1]
    print(compare("reference (float64)", ref, ref, targets))
    print(compare("cadence", ref, ours[..., :vocab], targets))
    for label, theirs in results.items():
        print(compare(label, ref, theirs[..., :vocab], targets))
    print("cadence's residual stream vs the reference, relative error (norm of difference / norm) after layer:")
    errs = [((a - b).norm() / b.norm()).item() for a, b in zip(our_layers, ref_layers)]
    print("  " + " ".join(f"{i}:{e:.2e}" for i, e in enumerate(errs)))


if __name__ == "__main__":
    main()
