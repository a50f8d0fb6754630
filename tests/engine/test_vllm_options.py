"""Every vLLM engine keyword and `vllm serve` flag is accounted for by cadence: it means the
same, is accepted with a one-line warning, or is refused naming a replacement
(`vllm_options.py`, one table shared by LLM(), `cadence serve` and `cadence generate`)."""

from __future__ import annotations

import argparse

import pytest
from vllm_args_data import ENGINE_ARGS, SERVE_FLAGS

from cadence.engine.llm import engine_config_from_kwargs
from cadence.engine.option_names import user_option_fields
from cadence.engine.vllm_options import REFUSE, SAME, VLLM_OPTIONS
from cadence.server.cli_serve import add_serve_arguments, configs_from_args

# cadence's own names for vLLM concepts spelled differently in LLM() (same meaning).
_LLM_ROUTED = {"model", "enable_chunked_prefill"}


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser


def test_every_engine_keyword_is_a_cadence_option_or_in_the_table():
    native = set(user_option_fields())
    missing = [n for n in ENGINE_ARGS
               if n not in native and n not in VLLM_OPTIONS and n not in _LLM_ROUTED]
    assert not missing, f"vLLM keywords cadence does not account for: {missing}"


def test_llm_accepts_every_engine_keyword_at_its_vllm_default(capsys):
    native = set(user_option_fields())
    for name, default in ENGINE_ARGS.items():
        if name in ("model", "enable_chunked_prefill") or (name in native and default is None):
            continue
        if name in native and name not in VLLM_OPTIONS:
            continue  # cadence's option: its own default and checks (tested with the config)
        engine_config_from_kwargs("m", **{name: default})
    # Line 1 of most vLLM scripts: accepted, with one line saying what it does.
    capsys.readouterr()
    engine_config_from_kwargs("m", gpu_memory_utilization=0.5)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gpu_memory_utilization" in err[0] and "KV pool" in err[0]
    # ... and applied: a share of free RAM for the KV pool (cadence's name wins when given).
    assert engine_config_from_kwargs(
        "m", gpu_memory_utilization=0.5).cache.kv_cache_memory_fraction == 0.5
    assert engine_config_from_kwargs("m", gpu_memory_utilization=0.5,
                                     kv_cache_memory_fraction=0.2).cache.kv_cache_memory_fraction == 0.2


def test_refusals_name_the_option_and_what_to_do():
    cases = {"tensor_parallel_size": 2, "revision": "main", "enable_lora": True,
             "kv_transfer_config": {"kv_connector": "x"}, "task": "embed",
             "hf_overrides": {"rope_theta": 1.0}}
    for name, value in cases.items():
        with pytest.raises(ValueError) as exc:
            engine_config_from_kwargs("m", **{name: value})
        message = str(exc.value)
        assert name in message and VLLM_OPTIONS[name].note.split(":")[0] in message
        assert "\n" not in message


def test_every_table_entry_is_consistent():
    for option in VLLM_OPTIONS.values():
        assert option.note and option.cli in ("switch", "value", "values")
        if option.handling == REFUSE:
            assert option.same is not None, f"{option.name}: a refusal needs its default"
        assert option.handling != SAME or option.same is None or option.same


def test_serve_parses_every_vllm_flag_and_the_issue_line():
    parser = _serve_parser()
    engine_flags = [("--" + n.replace("_", "-")) for n in ENGINE_ARGS]
    known = parser._option_string_actions
    missing = [f for f in [*engine_flags, *SERVE_FLAGS] if f not in known]
    assert not missing, f"vllm serve flags cadence does not parse: {missing}"
    for flag, values in SERVE_FLAGS.items():
        if values is not None:
            args = parser.parse_args(["--model", "m", flag, *values])
            configs_from_args(args)
    args = parser.parse_args(
        "--model m --tensor-parallel-size 1 --trust-remote-code --enforce-eager "
        "--gpu-memory-utilization 0.5 --disable-log-requests --swap-space 4 --max-logprobs 5 "
        "--root-path /api --allowed-origins https://a.example --served-model-name a b "
        "--return-tokens-as-token-ids".split())
    server, process = configs_from_args(args)
    assert server.served_model_name == "a" and server.served_model_aliases == ("b",)
    assert server.cors_allowed_origins == ("https://a.example",) and server.root_path == "/api"
    assert process.served_model_name == "a" and server.return_tokens_as_token_ids
    assert process.engine_config["cache"]["kv_cache_memory_fraction"] == 0.5
    with pytest.raises(ValueError, match="--tensor-parallel-size 2 .*one engine process"):
        configs_from_args(parser.parse_args(["--model", "m", "--tensor-parallel-size", "2"]))


def test_docs_page_shows_the_table():
    import pathlib

    from cadence.engine.vllm_options import markdown_table

    page = pathlib.Path(__file__).parents[2] / "docs" / "vllm.md"
    assert page.read_text().endswith(markdown_table())


def test_llm_with_a_hub_id_says_how_to_get_the_files():
    from cadence import LLM

    with pytest.raises(ValueError, match="huggingface-cli download Org/Model --local-dir"):
        LLM("Org/Model")
    with pytest.raises(ValueError, match="model path does not exist: /no/such/dir"):
        LLM("/no/such/dir")
