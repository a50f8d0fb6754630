"""Cost of structured-output grammar masks per engine step (llguidance, the default model's
49k-token vocabulary), for batches of constrained requests.

Each step computes the allowed-token bitmask of every constrained row (executor/
structured_output.py, the same code the executor runs), turns it into a bool mask and applies it
to random logits the way the sampler does, then each row takes its best allowed token, which the
next step feeds to its matcher. Prints ms per step by batch size; compare with a decode step of
the same batch (benchmarks/model_bench.py).

    .venv/bin/python benchmarks/structured_output_bench.py [--steps 40] [--batches 1,8,32]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cadence.core.plan import ScheduledChunk
from cadence.core.sampling_params import SamplingParams, StructuredOutputsParams
from cadence.executor.logits_processors import apply_logits_processors
from cadence.executor.structured_output import StructuredOutputs

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--engine", action="store_true",
                        help="also run the default model: step time with and without a schema")
    args = parser.parse_args()

    import gguf

    from cadence.model.gguf_tokenizer import tokenizer_from_gguf
    from cadence.model.loader import default_model_path

    torch.set_num_threads(2)
    tokenizer = tokenizer_from_gguf(gguf.GGUFReader(default_model_path()))
    vocab = tokenizer.vocab_size
    t0 = time.perf_counter()
    grammars = StructuredOutputs(tokenizer, vocab)
    grammars.check(StructuredOutputsParams(json=SCHEMA))
    print(f"tokenizer + grammar compile: {time.perf_counter() - t0:.2f} s (once per process / "
          f"schema), vocab {vocab}")
    params = SamplingParams(temperature=0, max_tokens=512,
                            structured_outputs=StructuredOutputsParams(json=SCHEMA))
    gen = torch.Generator().manual_seed(0)
    for batch in (int(b) for b in args.batches.split(",")):
        histories = [[1, 2, 3] for _ in range(batch)]  # a 3-token "prompt" each
        mask_ms, apply_ms = [], []
        for step in range(args.steps):
            chunks = [ScheduledChunk(f"r{batch}-{i}", (h[-1],), len(h) - 1, (0,), True, params,
                                     len(h) - 3, is_prefill=False, history=h,
                                     num_prompt_tokens=3)
                      for i, h in enumerate(histories)]
            logits = torch.randn(batch, vocab, generator=gen)
            t0 = time.perf_counter()
            masks = grammars.masks(chunks)
            t1 = time.perf_counter()
            processed, _ = apply_logits_processors(logits, chunks, masks)
            best = processed.argmax(dim=-1).tolist()
            t2 = time.perf_counter()
            mask_ms.append((t1 - t0) * 1e3)
            apply_ms.append((t2 - t1) * 1e3)
            for h, tok in zip(histories, best):
                h.append(tok)
        for i in range(batch):
            grammars.release(f"r{batch}-{i}")
        print(f"batch {batch:3d}: mask {statistics.median(mask_ms):6.2f} ms/step "
              f"(p90 {sorted(mask_ms)[int(0.9 * len(mask_ms))]:.2f}), apply + argmax "
              f"{statistics.median(apply_ms):6.2f} ms/step, "
              f"{statistics.median(mask_ms) / batch * 1e3:.0f} us per constrained row")


def engine_steps(batch: int, max_tokens: int) -> None:
    """The default model: mean decode step time of `batch` requests with and without a JSON
    schema (masks overlap the forward; what remains is the wait for them and the apply)."""
    from cadence import LLM

    llm = LLM(max_num_seqs=batch)
    schema = StructuredOutputsParams(json=SCHEMA)
    prompts = [f"Describe person number {i} as JSON." for i in range(batch)]
    for label, structured in (("plain", None), ("json schema", schema), ("plain", None),
                              ("json schema", schema)):
        params = SamplingParams(temperature=0.8, seed=1, max_tokens=max_tokens, ignore_eos=True,
                                structured_outputs=structured)
        engine = llm.engine
        t_before = engine.telemetry.num_steps_total
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        dt = time.perf_counter() - t0
        steps = engine.telemetry.num_steps_total - t_before
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        print(f"engine batch {batch} {label:11s}: {dt / steps * 1e3:6.1f} ms/step over {steps} "
              f"steps, {tokens} tokens, last mask {engine.executor.last_mask_time_s * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
    import sys

    if "--engine" in sys.argv:
        engine_steps(8, 48)
