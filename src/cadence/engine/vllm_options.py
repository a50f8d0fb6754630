"""vLLM's engine and server options that are not cadence options of their own: one table shared
by `LLM(...)`, `cadence serve` and `cadence generate`, so a vLLM script or command line runs
unchanged and every option is accounted for.

Each entry says what the option does here:
- SAME: it means what it means in vLLM for the values in `same` (tensor_parallel_size=1: one
  process; trust_remote_code: cadence never runs checkpoint code either way); any other value
  is refused with `note` (what to do instead).
- WARN: accepted with a one-line warning, because it has no meaning on this engine (`note` says
  why and which cadence option does the job). A WARN option with `maps_to` is applied through
  that cadence option (gpu_memory_utilization -> kv_cache_memory_fraction, a share of free
  RAM for the KV pool), the warning saying so.
- REFUSE: any value but its default (`same`) is an error naming the replacement in `note`.
- SERVER: the server implements it (CORS, root_path); `LLM()` accepts it as SAME.

Options cadence has under the same name (max_num_seqs, block_size, ...) are not here: they come
from the config dataclasses (`option_names.py`) and mean the same by construction.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

SAME, WARN, REFUSE, SERVER = "same", "warn", "refuse", "server"
ANY = None  # `same` of an option whose every value means the same here


@dataclass(frozen=True)
class VllmOption:
    name: str  # vLLM's keyword; the flag is --name-with-dashes
    handling: str  # SAME / WARN / REFUSE / SERVER
    note: str  # why, and what cadence offers instead
    same: tuple[Any, ...] | None = ANY  # values that mean the same here (None: every value)
    cli: str = "value"  # `serve` flag shape: "switch" (--x/--no-x), "value", "values" (1+)
    # The cadence option (CacheConfig field) a WARN option's value is given to, if any.
    maps_to: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


_LOCAL = ("cadence loads local files only: `huggingface-cli download REPO --local-dir DIR` "
          "(add --revision REV), then pass DIR")
_LORA = "LoRA is not supported: merge the adapter into the weights (peft merge_and_unload)"
_SPEC = "speculative decoding is not supported"
_MM = "cadence serves text-only models"
_TLS = "cadence serves plain HTTP: put a TLS-terminating proxy (nginx, caddy) in front"

_TABLE = (
    # ---- parallelism and devices: one engine process on the CPU
    VllmOption("tensor_parallel_size", SAME, "cadence runs one engine process on the CPU "
               "(--engine-threads sets its threads)", (1,)),
    VllmOption("pipeline_parallel_size", SAME, "cadence runs one engine process", (1,)),
    VllmOption("data_parallel_size", SAME, "LLM() runs one engine; `cadence serve "
               "--data-parallel-size N` runs N replicas behind a router", (1,)),
    VllmOption("distributed_executor_backend", SAME, "LLM() runs one engine process; serve's "
               "replicas take mp or ray", (None, "mp", "uni")),
    VllmOption("enable_expert_parallel", SAME, "no expert parallelism", (False,), "switch"),
    VllmOption("disable_custom_all_reduce", SAME, "no all-reduce on one process", ANY, "switch"),
    VllmOption("max_parallel_loading_workers", WARN, "weights are memory-mapped; ignored"),
    VllmOption("worker_cls", SAME, "cadence has one worker type", ("auto",)),
    VllmOption("ray_workers_use_nsight", SAME, "no Ray workers", (False,), "switch"),
    # ---- memory: host RAM, sized by cadence's own options
    VllmOption("gpu_memory_utilization", WARN, "no GPU memory to share: the KV pool takes this "
               "share of the RAM free after the weights load (MemAvailable), less one step's "
               "activations: --kv-cache-memory-fraction (--kv-cache-memory-bytes or "
               "--num-gpu-blocks-override win; default 2 GiB)",
               maps_to="kv_cache_memory_fraction"),
    VllmOption("swap_space", WARN, "preempted requests' KV goes to --num-swap-blocks blocks "
               "of host memory (and --kv-offload-dir on disk); ignored"),
    VllmOption("cpu_offload_gb", WARN, "weights already live in host memory; ignored"),
    VllmOption("kv_cache_memory_bytes_per_gpu", WARN, "use --kv-cache-memory-bytes; ignored"),
    # ---- compilation and graphs: kernels are built ahead, there are no CUDA graphs
    VllmOption("enforce_eager", SAME, "cadence has no CUDA graphs: it always runs eagerly",
               ANY, "switch"),
    VllmOption("compilation_config", WARN, "no torch.compile or CUDA graphs: cadence's CPU "
               "kernels are compiled once and cached; ignored"),
    VllmOption("max_seq_len_to_capture", WARN, "no CUDA graphs to capture; ignored"),
    VllmOption("cuda_graph_sizes", WARN, "no CUDA graphs to capture; ignored"),
    VllmOption("max_cudagraph_capture_size", WARN, "no CUDA graphs to capture; ignored"),
    VllmOption("async_scheduling", WARN, "cadence's engine loop overlaps scheduling with its "
               "own model step; ignored", ANY, "switch"),
    # ---- model and tokenizer loading
    VllmOption("trust_remote_code", SAME, "cadence never runs code from a checkpoint; its "
               "model families are built in", ANY, "switch"),
    VllmOption("task", SAME, "cadence serves text generation only", ("auto", "generate")),
    VllmOption("runner", SAME, "cadence serves text generation only", ("auto", "generate")),
    VllmOption("tokenizer_mode", SAME, "cadence uses the checkpoint's tokenizer.json or GGUF "
               "vocabulary (tokenizer_mode 'auto')", ("auto", "hf")),
    VllmOption("skip_tokenizer_init", SAME, "cadence always loads the tokenizer", (False,),
               "switch"),
    VllmOption("load_format", SAME, "cadence reads safetensors folders and GGUF files",
               ("auto", "safetensors", "gguf")),
    VllmOption("config_format", SAME, "cadence reads Hugging Face config.json or GGUF "
               "metadata", ("auto", "hf")),
    VllmOption("revision", REFUSE, _LOCAL, (None,)),
    VllmOption("code_revision", REFUSE, _LOCAL, (None,)),
    VllmOption("tokenizer_revision", REFUSE, _LOCAL, (None,)),
    VllmOption("download_dir", WARN, "cadence downloads nothing (pass a local folder or GGUF "
               "file); ignored"),
    VllmOption("ignore_patterns", WARN, "cadence downloads nothing; ignored"),
    VllmOption("model_loader_extra_config", REFUSE, "cadence has one loader", (None,)),
    VllmOption("hf_overrides", REFUSE, "edit config.json in a local copy of the model folder",
               (None, {})),
    VllmOption("hf_config_path", REFUSE, "put config.json next to the weights", (None,)),
    VllmOption("rope_scaling", REFUSE, "rope settings come from config.json: edit a local "
               "copy", (None, {})),
    VllmOption("rope_theta", REFUSE, "rope settings come from config.json: edit a local copy",
               (None,)),
    VllmOption("model_impl", SAME, "cadence's own model implementations",
               ("auto", "cadence")),
    VllmOption("disable_sliding_window", SAME, "sliding windows are honoured as the model "
               "config says", (False,), "switch"),
    VllmOption("override_generation_config", REFUSE, "use --generation-config (a folder with "
               "generation_config.json, or 'vllm' for none) or per-request SamplingParams",
               (None, {})),
    VllmOption("override_neuron_config", SAME, "no Neuron devices", (None, {})),
    VllmOption("override_pooler_config", SAME, "no pooling models", (None,)),
    VllmOption("calculate_kv_scales", SAME, "no fp8 KV scales", (None, False), "switch"),
    VllmOption("max_logprobs", WARN, "cadence returns up to 20 logprobs per token, fixed; "
               "ignored"),
    VllmOption("logprobs_mode", SAME, "logprobs are of the processed distribution",
               ("raw_logprobs", "processed_logprobs")),
    # ---- logging and observability
    VllmOption("disable_log_stats", SAME, "cadence logs no periodic stats lines; /metrics and "
               "the dashboard have them", ANY, "switch"),
    VllmOption("disable_log_requests", SAME, "requests are logged only with "
               "--enable-log-requests", ANY, "switch"),
    VllmOption("otlp_traces_endpoint", REFUSE, "use --trace FILE (Chrome/Perfetto trace of "
               "every step and request)", (None,)),
    VllmOption("collect_detailed_traces", REFUSE, "use --trace FILE", (None,)),
    VllmOption("show_hidden_metrics_for_version", WARN, "cadence's /metrics are stable; ignored"),
    # ---- scheduler extras
    VllmOption("num_scheduler_steps", SAME, "one step per schedule", (1,)),
    VllmOption("multi_step_stream_outputs", SAME, "outputs stream every step", ANY, "switch"),
    VllmOption("use_v2_block_manager", SAME, "cadence's paged KV manager", ANY, "switch"),
    VllmOption("num_lookahead_slots", SAME, "no lookahead slots", (0,)),
    VllmOption("scheduler_delay_factor", SAME, "no delay factor: use --policy slo "
               "--target-itl-ms", (0, 0.0)),
    VllmOption("preemption_mode", SAME, "preemption recomputes, or swaps with "
               "--num-swap-blocks", (None, "recompute", "swap")),
    VllmOption("disable_async_output_proc", SAME, "outputs are processed in the engine loop",
               ANY, "switch"),
    VllmOption("scheduler_cls", SAME, "choose a policy with --policy", (None,)),
    VllmOption("enable_sleep_mode", SAME, "no sleep mode", (False,), "switch"),
    VllmOption("kv_transfer_config", REFUSE, "use `cadence serve --disagg` (prefill/decode "
               "workers, docs/disaggregation.md)", (None,)),
    VllmOption("kv_events_config", REFUSE, "KV events are not published; see /metrics",
               (None,)),
    # ---- structured outputs and decoding
    VllmOption("guided_decoding_backend", WARN, "cadence's own grammar engine serves "
               "structured outputs; ignored"),
    VllmOption("structured_outputs_config", WARN, "cadence's own grammar engine serves "
               "structured outputs; ignored"),
    VllmOption("reasoning_parser", SERVER, "how reasoning is read from the output "
               "(reasoning / reasoning_content): deepseek_r1, deepseek_v3, granite or qwen3"),
    VllmOption("logits_processor_pattern", SAME, "no custom logits processors", (None,)),
    VllmOption("logits_processors", SAME, "no custom logits processors", (None, [])),
    VllmOption("intial_incremental_detokenization_offset", WARN, "cadence detokenizes "
               "incrementally from the first token; ignored"),
    VllmOption("enable_prompt_embeds", SAME, "prompts are text or token ids", (False,),
               "switch"),
    # ---- LoRA, adapters, speculative decoding, multimodal: not supported
    VllmOption("enable_lora", SAME, _LORA, (False,), "switch"),
    VllmOption("enable_lora_bias", SAME, _LORA, (False,), "switch"),
    VllmOption("max_loras", WARN, _LORA + "; ignored"),
    VllmOption("max_lora_rank", WARN, _LORA + "; ignored"),
    VllmOption("lora_extra_vocab_size", WARN, _LORA + "; ignored"),
    VllmOption("lora_dtype", WARN, _LORA + "; ignored"),
    VllmOption("max_cpu_loras", WARN, _LORA + "; ignored"),
    VllmOption("fully_sharded_loras", SAME, _LORA, (False,), "switch"),
    VllmOption("long_lora_scaling_factors", SAME, _LORA, (None,)),
    VllmOption("qlora_adapter_name_or_path", SAME, _LORA, (None,)),
    VllmOption("lora_modules", SAME, _LORA, (None, []), "values"),
    VllmOption("enable_prompt_adapter", SAME, "prompt adapters are not supported", (False,),
               "switch"),
    VllmOption("max_prompt_adapters", WARN, "prompt adapters are not supported; ignored"),
    VllmOption("max_prompt_adapter_token", WARN, "prompt adapters are not supported; ignored"),
    VllmOption("speculative_config", SAME, _SPEC, (None, {})),
    VllmOption("speculative_model", SAME, _SPEC, (None,)),
    VllmOption("num_speculative_tokens", SAME, _SPEC, (None, 0)),
    VllmOption("limit_mm_per_prompt", SAME, _MM, (None, {})),
    VllmOption("mm_processor_kwargs", SAME, _MM, (None, {})),
    VllmOption("disable_mm_preprocessor_cache", SAME, _MM, ANY, "switch"),
    VllmOption("allowed_local_media_path", SAME, _MM, (None, "")),
    # ---- the OpenAI server (`vllm serve` frontend flags)
    VllmOption("allowed_origins", SERVER, "CORS: origins allowed to call the API (JSON list)"),
    VllmOption("allowed_methods", SERVER, "CORS: methods allowed (JSON list)"),
    VllmOption("allowed_headers", SERVER, "CORS: headers allowed (JSON list)"),
    VllmOption("allow_credentials", SERVER, "CORS: allow credentials", ANY, "switch"),
    VllmOption("served_model_name", SERVER, "the names clients may send (the first is the "
               "one responses carry); offline it is only a label", ANY, "values"),
    VllmOption("root_path", SERVER, "the path prefix a proxy serves the API under"),
    VllmOption("ssl_keyfile", REFUSE, _TLS, (None,)),
    VllmOption("ssl_certfile", REFUSE, _TLS, (None,)),
    VllmOption("ssl_ca_certs", REFUSE, _TLS, (None,)),
    VllmOption("ssl_cert_reqs", REFUSE, _TLS, (None, 0)),
    VllmOption("uds", REFUSE, "cadence listens on TCP: use --host/--port", (None,)),
    VllmOption("middleware", REFUSE, "no custom ASGI middleware; put a proxy in front",
               (None, []), "values"),
    VllmOption("response_role", SAME, "replies have role 'assistant'", ("assistant",)),
    VllmOption("chat_template_content_format", SAME, "content-part lists are joined into one "
               "string for the template", ("auto", "string")),
    VllmOption("return_tokens_as_token_ids", SERVER, "logprobs name tokens 'token_id:<id>' "
               "(a request's return_tokens_as_token_ids wins)", ANY, "switch"),
    VllmOption("enable_auto_tool_choice", SERVER, "tool calling (tool_choice 'auto'); needs "
               "--tool-call-parser", ANY, "switch"),
    VllmOption("tool_call_parser", SERVER, "how tool calls are read from the output: hermes, "
               "llama3_json or pythonic"),
    VllmOption("tool_parser_plugin", REFUSE, "no parser plugins: --tool-call-parser takes "
               "hermes, llama3_json or pythonic", (None, "")),
    VllmOption("enable_prompt_tokens_details", SAME, "usage always has prompt_tokens_details "
               "when tokens came from the prefix cache", ANY, "switch"),
    VllmOption("enable_server_load_tracking", WARN, "load is on /metrics and the dashboard; "
               "ignored", ANY, "switch"),
    VllmOption("enable_force_include_usage", WARN, "usage is in every non-streamed reply and "
               "with stream_options.include_usage; ignored", ANY, "switch"),
    VllmOption("enable_request_id_headers", WARN, "ids are in the response bodies; ignored",
               ANY, "switch"),
    VllmOption("disable_fastapi_docs", WARN, "the OpenAPI schema stays at /openapi.json; "
               "ignored", ANY, "switch"),
    VllmOption("disable_uvicorn_access_log", SAME, "access lines are logged only with "
               "--enable-log-requests", ANY, "switch"),
    VllmOption("disable_frontend_multiprocessing", WARN, "use --in-process-engine to run the "
               "engine in the server process; ignored", ANY, "switch"),
    VllmOption("max_log_len", WARN, "request logs show sizes, not prompts; ignored"),
    VllmOption("log_config_file", WARN, "use --log-level; ignored"),
    VllmOption("enable_log_outputs", WARN, "outputs are not logged; ignored", ANY, "switch"),
    VllmOption("tokens_only", SAME, "all endpoints are served", (False,), "switch"),
)

VLLM_OPTIONS: dict[str, VllmOption] = {o.name: o for o in _TABLE}


def coerce_cli_value(text: Any) -> Any:
    """A flag's text as vLLM reads it: JSON where it parses ('1', '0.5', '["*"]', 'null'),
    'true'/'false' and 'None' too, the text itself otherwise."""
    if not isinstance(text, str):
        return text
    if text in ("None", "none"):
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        return json.loads(text)
    except ValueError:
        return text


def check_vllm_options(given: dict[str, Any], spell: str = "keyword") -> dict[str, Any]:
    """Apply the table to options a caller passed (vLLM names -> values).

    Returns the SERVER options (for the server to implement); warns once per WARN option (one
    line on stderr); raises ValueError naming the option, the value and what to do instead.
    `spell`: "flag" writes names as --flags (serve, generate), "keyword" as name= (LLM())."""
    server: dict[str, Any] = {}
    for name, value in given.items():
        option = VLLM_OPTIONS[name]
        shown = option.flag if spell == "flag" else f"{name}="
        if option.handling == SERVER:
            server[name] = value
        elif option.handling == WARN and option.maps_to is not None:
            warn(f"{shown.rstrip('=')} {value!r} is mapped: {option.note}")
        elif option.handling == WARN:
            warn(f"{shown.rstrip('=')} has no meaning on cadence: {option.note}")
        elif option.same is not None and not _in(value, option.same):
            allowed = ", ".join(repr(v) for v in option.same)
            raise ValueError(f"{shown}{'' if spell == 'keyword' else ' '}{value!r} is not "
                             f"supported: {option.note} (accepted: {allowed})")
    return server


def vllm_mapped(given: dict[str, Any]) -> dict[str, Any]:
    """The cadence options (CacheConfig fields) that vLLM options given map onto."""
    return {VLLM_OPTIONS[name].maps_to: value for name, value in given.items()
            if VLLM_OPTIONS[name].maps_to is not None and value is not None}


def _in(value: Any, allowed: tuple[Any, ...]) -> bool:
    # 1 == 1.0 == True in Python; a bool must match a bool.
    return any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in allowed)


def warn(message: str) -> None:
    """One line on stderr, before any logging is set up (flags are read first)."""
    print(f"WARNING cadence: {message}", file=sys.stderr)


def add_vllm_arguments(parser: argparse.ArgumentParser) -> None:
    """vLLM's flags that are not cadence flags of their own (vllm_options.py: the same meaning,
    a one-line warning, or a refusal naming the replacement), so `vllm serve` lines run."""
    group = parser.add_argument_group(
        "vLLM compatibility", "vLLM's flags: each means the same here, is ignored with a "
        "warning saying why, or is refused naming what to use (docs/vllm.md).")
    for option in VLLM_OPTIONS.values():
        if option.flag in parser._option_string_actions:
            continue  # a cadence flag of the same name (and meaning)
        kwargs: dict[str, Any] = {"dest": "vllm." + option.name, "default": None,
                                  "help": f"vLLM's; {option.handling}: {option.note}"}
        if option.cli == "switch":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif option.cli == "values":
            kwargs["nargs"] = "+"
        group.add_argument(option.flag, **kwargs)


def vllm_values(args: argparse.Namespace) -> dict[str, Any]:
    """The vLLM flags given, read as vLLM reads them (JSON values, 'None')."""
    out = {}
    for key, value in vars(args).items():
        if key.startswith("vllm.") and value is not None:
            out[key[5:]] = ([coerce_cli_value(v) for v in value] if isinstance(value, list)
                            else coerce_cli_value(value))
    return out


def markdown_table() -> str:
    """The table as docs/vllm.md shows it (a test keeps the page equal to this)."""
    rows = ["| vLLM option | here | what it does / what to use |", "|---|---|---|"]
    for o in VLLM_OPTIONS.values():
        shown = o.handling if o.same is None or o.handling != SAME else (
            "same for " + ", ".join(repr(v) for v in o.same))
        rows.append(f"| `{o.name}` / `{o.flag}` | {shown} | {o.note} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
