"""vLLM's serve spellings: positional MODEL, --enable-chunked-prefill, the new engine flags, and
one name per concept in `serve`, `generate` and `LLM()`."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.engine.cli_generate import register as register_generate
from cadence.engine.config import EngineConfig
from cadence.engine.llm import engine_config_from_kwargs
from cadence.engine.option_names import flag_of, user_option_fields
from cadence.server.cli_serve import add_serve_arguments, configs_from_args


def _serve(*argv: str):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return configs_from_args(parser.parse_args(argv))


def test_positional_model_and_chunked_prefill_switch():
    _, process = _serve("/models/m.gguf", "--no-enable-chunked-prefill")
    assert process.engine_config["model"] == "/models/m.gguf"
    assert process.engine_config["scheduler"]["policy"] == "eager"
    _, process = _serve("--model", "/m", "--enable-chunked-prefill")
    assert process.engine_config["scheduler"]["policy"] == "chunked"
    with pytest.raises(ValueError, match="--policy"):
        _serve("--enable-chunked-prefill", "--policy", "eager")
    with pytest.raises(ValueError, match="disagree"):
        _serve("/a", "--model", "/b")


def test_engine_flags_reach_the_engine_config():
    server, process = _serve(
        "--tokenizer", "/tok", "--chat-template", "t.jinja", "--generation-config", "vllm",
        "--quantization", "int8", "--kv-cache-dtype", "auto", "--enable-log-requests",
        "--uvicorn-log-level", "warning", "--num-gpu-blocks-override", "64",
        "--kv-cache-memory-bytes", "1GiB", "--scheduling-policy", "priority")
    engine = process.engine_config
    assert (engine["tokenizer"], engine["chat_template"], engine["generation_config"],
            engine["quantization"], engine["kv_cache_dtype"]) == (
        "/tok", "t.jinja", "vllm", "int8", "auto")
    assert engine["cache"]["num_blocks"] == 64 and engine["cache"]["kv_cache_memory_bytes"] == 2**30
    assert engine["scheduler"]["scheduling"] == "priority"
    assert server.enable_log_requests


def test_one_name_per_concept_in_serve_generate_and_llm():
    serve = argparse.ArgumentParser()
    add_serve_arguments(serve)
    generate_parent = argparse.ArgumentParser()
    register_generate(generate_parent.add_subparsers())
    generate = generate_parent._subparsers._group_actions[0].choices["generate"]

    def flags(parser):
        return {s for a in parser._actions for s in a.option_strings}

    serve_flags, generate_flags = flags(serve), flags(generate)
    for cls in (SchedulerConfig, CacheConfig, EngineConfig):
        for f in dataclasses.fields(cls):
            name = user_option_fields()
            if f.name in ("scheduler", "cache", "model") or f.name.startswith("telemetry"):
                continue
            flag = flag_of(f)
            if f.name == "trace_path":
                flag = "--trace"
            assert flag in serve_flags, flag
            assert flag in generate_flags, flag
            key = flag.removeprefix("--").replace("-", "_")
            if f.name != "trace_path":
                assert key in name, key
    # The same names as LLM() keywords, and vLLM's switch there too.
    cfg = engine_config_from_kwargs(scheduling_policy="priority", num_gpu_blocks_override=9,
                                    kv_cache_memory_bytes=1000, enable_chunked_prefill=False)
    assert cfg.scheduler.scheduling == "priority" and cfg.cache.num_blocks == 9
    assert cfg.scheduler.policy == "eager"
    with pytest.raises(TypeError, match="scheduling"):
        engine_config_from_kwargs(scheduling="priority")  # the internal field name is not one


def test_quantization_gguf_is_a_flag_value_the_loader_knows():
    """Every --quantization the loader serves is a choice of the flag (serve and generate)."""
    from cadence.model.loader import QUANTIZATIONS

    _, process = _serve("/models/m.gguf", "--quantization", "gguf")
    assert process.engine_config["quantization"] == "gguf"
    choices = next(f.metadata["choices"] for f in dataclasses.fields(EngineConfig)
                   if f.name == "quantization")
    assert set(choices) == set(QUANTIZATIONS)
