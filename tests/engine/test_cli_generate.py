"""`cadence generate` on the tiny model: flags reach the configs, text is printed, errors exit."""

from __future__ import annotations

import argparse

import pytest

from cadence.cli import build_parser, main
from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.engine.cli_args import add_config_args, config_from_args
from cadence.engine.llm import LLM
from cadence.core.sampling_params import SamplingParams


def test_generate_prints_the_greedy_completion(tiny_llama_dir, capsys):
    argv = ["generate", "--model", tiny_llama_dir, "--prompt", "Hello world", "--max-tokens", "5",
            "--temperature", "0", "--dtype", "float32", "--no-progress", "--policy", "eager",
            "--max-num-batched-tokens", "64", "--max-num-seqs", "2", "--no-enable-prefix-caching"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    expected = LLM(tiny_llama_dir, dtype="float32").generate(
        "Hello world", SamplingParams(max_tokens=5, temperature=0.0)
    )[0].outputs[0].text
    assert printed == expected + "\n"


def test_chat_and_batch(tiny_llama_dir, capsys):
    argv = ["generate", "--model", tiny_llama_dir, "--chat", "--prompt", "hi", "--prompt", "yo",
            "--max-tokens", "3", "--temperature", "0", "--no-progress"]
    assert main(argv) == 0
    assert capsys.readouterr().out.count("--- [") == 2


def test_bad_values_exit_with_a_message(tiny_llama_dir, capsys):
    assert main(["generate", "--model", tiny_llama_dir, "--prompt", "x", "--max-tokens", "0"]) == 2
    assert "max_tokens" in capsys.readouterr().err
    assert main(["generate", "--model", "/no/such/model", "--prompt", "x"]) == 1
    assert "cannot load model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--prompt", "x", "--policy", "fastest"])


def test_config_flags_round_trip():
    p = argparse.ArgumentParser()
    add_config_args(p, SchedulerConfig)
    add_config_args(p, CacheConfig)
    args = p.parse_args(["--max-num-batched-tokens", "128", "--no-enable-prefix-caching",
                         "--num-gpu-blocks-override", "9", "--scheduling-policy", "priority"])
    sched = config_from_args(args, SchedulerConfig)
    cache = config_from_args(args, CacheConfig)
    assert sched.max_num_batched_tokens == 128 and sched.policy == "adaptive"
    assert cache.num_blocks == 9 and cache.enable_prefix_caching is False
    assert sched.scheduling == "priority"
