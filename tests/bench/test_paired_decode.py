"""benchmarks/paired_decode.py's two sides run the same workload.

cadence's side (benchmarks/tg_worker.py) must be llama-bench's tg: N forward passes at
positions 0..N-1 from a one-token prompt, or N decode steps after an untimed D-token prompt;
llama.cpp's side must pass -d and key each depth's result apart."""

from __future__ import annotations

import json
import sys

import pytest

from tests.bench.bench_modules import load_benchmark


tg_worker = load_benchmark("tg_worker")
llamacpp_peer = load_benchmark("llamacpp_peer")


@pytest.fixture(scope="module")
def llm(tiny_llama_d64_dir):
    from cadence.engine.llm import LLM

    engine = LLM(tiny_llama_d64_dir, startup_profile=False)
    yield engine
    engine.close()


def test_depth_zero_is_n_forward_passes_from_one_token(llm):
    run = tg_worker.run_tg(llm, 6, 0, "a")
    assert len(run.step_s) == 6 and len(run.tokens) == 6  # one token per engine step
    assert len(run.executor_s) == 6 and all(s > 0 for s in run.executor_s)
    assert run.seconds == pytest.approx(sum(run.step_s))
    # The same greedy tokens as the offline API's, from the same one-token prompt.
    from cadence.core.sampling_params import SamplingParams

    out = llm.generate([{"prompt_token_ids": [tg_worker.FIRST_TOKEN]}],
                       SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    assert list(out[0].outputs[0].token_ids) == run.tokens


def test_depth_times_only_the_decode_steps_after_the_prompt(llm):
    run = tg_worker.run_tg(llm, 4, 40, "b")
    # The prompt's step (and its first token) is untimed: 4 timed decode steps, 4 tokens.
    assert len(run.step_s) == 4 and len(run.tokens) == 4
    prompt = tg_worker.depth_prompt(40, llm.engine.model_config.vocab_size)
    assert len(prompt) == 40 and prompt == tg_worker.depth_prompt(40, llm.engine.model_config.vocab_size)


def test_llama_bench_depths_are_passed_and_keyed(tmp_path, monkeypatch):
    """A stand-in llama-bench that records its arguments and answers as the real one does."""
    log = tmp_path / "args.json"
    fake = tmp_path / "llama-bench"
    rows = [{"n_prompt": 0, "n_gen": 32, "n_depth": 0, "avg_ts": 40.0},
            {"n_prompt": 0, "n_gen": 32, "n_depth": 512, "avg_ts": 30.0}]
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"json.dump(sys.argv[1:], open({str(log)!r}, 'w'))\n"
                    f"print(json.dumps({rows!r}))\n")
    fake.chmod(0o755)
    asked = []
    monkeypatch.setattr(llamacpp_peer, "binary", lambda name, variant="native": asked.append(variant) or fake)
    out = llamacpp_peer.llama_bench("m.gguf", 2, "tg32", repetitions=1, depths=(0, 512))
    assert out == {"tg32": 40.0, "tg32@d512": 30.0}
    args = json.loads(log.read_text())
    assert args[args.index("-d") + 1] == "0,512" and args[args.index("-n") + 1] == "32"
    llamacpp_peer.llama_bench("m.gguf", 2, "tg32", repetitions=1, variant="avx2")
    assert "-d" not in json.loads(log.read_text())  # depth 0 alone: llama-bench's default
    assert asked == ["native", "avx2"]  # the AVX2-only build where asked for


def test_avx2_tier_pairs_with_the_avx2_build_only_when_matched():
    paired = load_benchmark("paired_decode")
    args = paired.argparse.Namespace(llamacpp="match")
    assert [paired.peer_variant(args, t) for t in ("native", "avx512", "avx2")] == ["native", "native", "avx2"]
    args.llamacpp = "native"
    assert paired.peer_variant(args, "avx2") == "native"
