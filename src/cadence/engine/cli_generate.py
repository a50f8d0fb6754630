"""`cadence generate`: complete prompts offline and print the text.

    cadence generate --prompt "The capital of France is" --max-tokens 32 --temperature 0
    cadence generate --chat --prompt "Write a haiku about the sea." --policy eager
"""

from __future__ import annotations

import argparse
import sys

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.sampling_params import SamplingParams
from cadence.engine.cli_args import add_config_args, config_from_args
from cadence.engine.vllm_options import (add_vllm_arguments, check_vllm_options, vllm_mapped,
                                         vllm_values)
from cadence.engine.config import EngineConfig

_ENGINE_SKIP = ("trace_path", "telemetry_max_steps", "telemetry_max_finished")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `generate` subcommand to the top-level `cadence` parser."""
    p = subparsers.add_parser(
        "generate", help="complete prompts offline and print the text", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--prompt", action="append", required=True,
                   help="prompt text (repeat for a batch)")
    p.add_argument("--chat", action="store_true",
                   help="send each prompt as a user message through the chat template")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    sampling = p.add_argument_group("sampling")
    sampling.add_argument("--max-tokens", type=int, default=128)
    sampling.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    sampling.add_argument("--top-p", type=float, default=1.0)
    sampling.add_argument("--top-k", type=int, default=0, help="0 = off")
    sampling.add_argument("--min-p", type=float, default=0.0)
    sampling.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    sampling.add_argument("--ignore-eos", action="store_true")
    sampling.add_argument("--sampling-seed", type=int, default=None,
                          help="per-request seed (reproducible whatever the batch)")
    add_config_args(p.add_argument_group("engine"), EngineConfig, skip=_ENGINE_SKIP)
    sched_group = p.add_argument_group("scheduler")
    add_config_args(sched_group, SchedulerConfig)
    sched_group.add_argument(
        "--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None,
        help="vLLM's switch, mapped onto the policies: on = --policy chunked, off = eager.")
    add_config_args(p.add_argument_group("kv cache"), CacheConfig)
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="write every step and request as JSON lines to FILE")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="show a progress bar on stderr")
    add_vllm_arguments(p)  # after cadence's own flags: those of the same name win
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: `cadence --help` must not pay for loading torch.
    from cadence.engine.llm import LLM
    from cadence.engine.llm_engine import LLMEngine
    from cadence.model.errors import ModelLoadError

    if args.enable_chunked_prefill is not None:
        wanted = "chunked" if args.enable_chunked_prefill else "eager"
        if args.policy is not None and args.policy != wanted:
            print(f"cadence generate: --enable-chunked-prefill={args.enable_chunked_prefill} "
                  f"contradicts --policy {args.policy}", file=sys.stderr)
            return 2
        args.policy = wanted
    try:
        vllm_given = vllm_values(args)
        check_vllm_options(vllm_given, spell="flag")  # server-only ones mean nothing here
        # vLLM options mapped onto cadence's (--gpu-memory-utilization); cadence's flag wins.
        mapped = {k: v for k, v in vllm_mapped(vllm_given).items() if getattr(args, k) is None}
        params = SamplingParams(
            max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
            top_k=args.top_k, min_p=args.min_p, stop=tuple(args.stop),
            ignore_eos=args.ignore_eos, seed=args.sampling_seed,
        )
        cfg = config_from_args(
            args, EngineConfig,
            scheduler=config_from_args(args, SchedulerConfig),
            cache=config_from_args(args, CacheConfig, **mapped),
            trace_path=args.trace,
        )
    except ValueError as exc:
        print(f"cadence generate: {exc}", file=sys.stderr)
        return 2
    try:
        engine = LLMEngine(cfg)
    except (ModelLoadError, ValueError, OSError) as exc:
        print(f"cadence generate: cannot load model: {exc}", file=sys.stderr)
        return 1
    # The startup line (stderr, so stdout stays the generated text): tier, dtype, weights, KV.
    print(f"cadence generate: {engine.model_name}: {engine.fast_path}", file=sys.stderr)
    llm = LLM.from_engine(engine)
    try:
        if args.chat:
            system = [{"role": "system", "content": args.system}] if args.system else []
            convs = [system + [{"role": "user", "content": p}] for p in args.prompt]
            results = llm.chat(convs, params, use_tqdm=args.progress)
        else:
            results = llm.generate(args.prompt, params, use_tqdm=args.progress)
    except ValueError as exc:
        print(f"cadence generate: {exc}", file=sys.stderr)
        return 2
    finally:
        engine.close()
    status = 0
    for i, r in enumerate(r.outputs[0] for r in results):
        if len(results) > 1:
            print(f"--- [{i}] {r.finish_reason}, {len(r.token_ids)} tokens")
        print(r.text)
        if r.error:
            print(f"cadence generate: request {i} failed: {r.error}", file=sys.stderr)
            status = 1
    return status
