"""LLMEngine over the real scheduler and the FakeExecutor: text, stops, aborts, telemetry."""

from __future__ import annotations

import time

import pytest

from cadence.core.plan import SampledToken, StepOutput
from cadence.core.sampling_params import SamplingParams
from cadence.telemetry.recorder import TelemetryRecorder
from cadence.telemetry.trace_writer import TraceWriter, read_trace
from tests.engine.conftest import make_engine, run_to_completion


def joined(outs):
    return "".join(o.new_text for o in outs), [t for o in outs for t in o.new_token_ids]


def test_text_prompt_generates_reference_tokens_and_text(tokenizer):
    engine, fake = make_engine(tokenizer)
    prompt_ids = engine.add_request("a", "Hello there", SamplingParams(max_tokens=12))
    assert list(prompt_ids) == tokenizer.encode("Hello there")
    outs = run_to_completion(engine)["a"]
    text, ids = joined(outs)
    assert ids == fake.reference_generate(list(prompt_ids), 12)
    assert text == tokenizer.decode(ids)
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert [o.finished for o in outs].count(True) == 1
    assert outs[-1].num_output_tokens == 12 and outs[-1].num_prompt_tokens == len(prompt_ids)


def test_eos_ids_filled_from_tokenizer_and_stop_on_eos(tokenizer):
    engine, fake = make_engine(tokenizer, eos_one_in=3)
    ids = tokenizer.encode("abc")
    engine.add_request("a", ids, SamplingParams(max_tokens=200))
    assert engine.scheduler.get_request("a").sampling.eos_token_ids == tokenizer.stop_token_ids
    outs = run_to_completion(engine)["a"]
    _, out_ids = joined(outs)
    expected = fake.reference_generate(ids, 200, stop_ids=tokenizer.stop_token_ids)
    assert out_ids == expected and out_ids[-1] == tokenizer.eos_token_id
    assert outs[-1].finish_reason == "stop"


def test_ignore_eos_runs_to_max_tokens(tokenizer):
    engine, _ = make_engine(tokenizer, eos_one_in=2)
    engine.add_request("a", "x", SamplingParams(max_tokens=30, ignore_eos=True))
    outs = run_to_completion(engine)["a"]
    assert outs[-1].finish_reason == "length" and outs[-1].num_output_tokens == 30


def test_stop_string_cuts_text_exactly(tokenizer):
    engine, fake = make_engine(tokenizer)
    prompt = tokenizer.encode("Once upon")
    ref_ids = fake.reference_generate(prompt, 40)
    ref_text = tokenizer.decode(ref_ids)
    stop = ref_text[10:13]
    cut = ref_text.find(stop)
    engine.add_request("a", prompt, SamplingParams(max_tokens=40, stop=(stop,)))
    outs = run_to_completion(engine)["a"]
    text, ids = joined(outs)
    assert text == ref_text[:cut]
    assert outs[-1].finish_reason == "stop" and outs[-1].finished
    # Generation stopped at the token that completed the stop string (one char per token).
    assert ids == ref_ids[: cut + len(stop)]
    assert not engine.has_unfinished()
    assert engine.scheduler.stats().num_blocks_used == 0


def test_stop_string_prefix_is_held_back_not_lost(tokenizer):
    """A stop string that never completes: everything held back is released by the end."""
    engine, fake = make_engine(tokenizer)
    prompt = tokenizer.encode("abc")
    ref_ids = fake.reference_generate(prompt, 20)
    ref_text = tokenizer.decode(ref_ids)
    stop = ref_text[-1] + "\x01"  # starts like the last char, can never complete
    engine.add_request("a", prompt, SamplingParams(max_tokens=20, stop=(stop,)))
    outs = run_to_completion(engine)["a"]
    assert joined(outs)[0] == ref_text and outs[-1].finish_reason == "length"


def test_stop_token_ids(tokenizer):
    engine, fake = make_engine(tokenizer)
    prompt = tokenizer.encode("stop here")
    ref = fake.reference_generate(prompt, 30)
    stop_id = ref[5]
    engine.add_request("a", prompt, SamplingParams(max_tokens=30, stop_token_ids=(stop_id,)))
    outs = run_to_completion(engine)["a"]
    _, ids = joined(outs)
    assert ids == ref[: ref.index(stop_id) + 1]
    assert outs[-1].finish_reason == "stop"


def test_abort_mid_prefill_frees_blocks(tokenizer):
    engine, _ = make_engine(tokenizer, max_num_batched_tokens=8, block_size=4)
    prompt = tokenizer.encode("a fairly long prompt that needs several chunks")
    engine.add_request("a", prompt, SamplingParams(max_tokens=5))
    assert engine.step() == []  # first chunk of the prompt, nothing sampled
    req = engine.scheduler.get_request("a")
    assert 0 < req.num_computed_tokens < len(prompt)
    assert engine.scheduler.stats().num_blocks_used > 0
    assert engine.abort_request("a")
    assert engine.scheduler.stats().num_blocks_used == 0
    engine.scheduler.check_integrity()
    outs = engine.step()
    assert [(o.req_id, o.finished, o.finish_reason) for o in outs] == [("a", True, "abort")]
    assert not engine.has_unfinished()
    assert engine.step() == []
    timeline = engine.telemetry.timeline("a")
    assert timeline.finish_reason == "abort" and timeline.first_token_time is None
    assert not engine.abort_request("a")  # already finished


def test_abort_while_decoding_keeps_others_running(tokenizer):
    engine, fake = make_engine(tokenizer)
    p1, p2 = tokenizer.encode("first"), tokenizer.encode("second")
    engine.add_request("a", p1, SamplingParams(max_tokens=20))
    engine.add_request("b", p2, SamplingParams(max_tokens=20))
    for _ in range(3):
        engine.step()
    engine.abort_request("a")
    outs = run_to_completion(engine)
    assert outs["a"][-1].finish_reason == "abort"
    b_ids = [t for o in outs["b"] for t in o.new_token_ids]
    assert len(b_ids) == 17 and outs["b"][-1].finish_reason == "length"
    assert engine.scheduler.stats().num_blocks_used == 0


def test_telemetry_timelines_complete_and_consistent(tokenizer):
    engine, _ = make_engine(tokenizer, max_num_batched_tokens=16, max_num_seqs=3)
    prompts = ["short", "a somewhat longer prompt here", "x", "another one of medium size"]
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=6 + i))
    outs = run_to_completion(engine)
    rec = engine.telemetry
    assert rec.num_live == 0 and rec.num_finished_total == len(prompts)
    for i in range(len(prompts)):
        t = rec.timeline(f"r{i}")
        assert t.arrival_time <= t.first_scheduled_time <= t.first_token_time <= t.finished_time
        assert t.num_output_tokens == 6 + i == len(t.token_times)
        assert t.token_times == sorted(t.token_times) and t.token_times[0] == t.first_token_time
        assert t.ttft == pytest.approx(t.queue_time + t.prefill_time)
        assert len(t.itl) == t.num_output_tokens - 1
        assert t.tpot == pytest.approx(sum(t.itl) / len(t.itl))
        assert t.finish_reason == outs[f"r{i}"][-1].finish_reason == "length"
        assert t.num_prompt_tokens == len(tokenizer.encode(prompts[i]))
    for step in rec.steps:
        assert step.num_tokens <= 16 and step.num_seqs <= 3
        assert step.t_start <= step.t_end
        assert step.num_blocks_used + step.num_blocks_free == 256


def test_preemption_keeps_outputs_and_is_counted(tokenizer):
    engine, fake = make_engine(tokenizer, num_blocks=12, block_size=4, max_num_seqs=4)
    prompts = [tokenizer.encode(p) for p in ("alpha beta", "gamma delta", "epsilon", "zeta eta")]
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=10))
    outs = run_to_completion(engine)
    assert engine.scheduler.stats().num_preemptions_total > 0
    assert sum(t.num_preemptions for t in engine.telemetry.finished_timelines()) > 0
    for i, p in enumerate(prompts):
        assert joined(outs[f"r{i}"])[1] == fake.reference_generate(p, 10)


def test_idle_step_returns_quickly(tokenizer):
    engine, _ = make_engine(tokenizer)
    t0 = time.perf_counter()
    for _ in range(100):
        assert engine.step() == []
    assert not engine.has_unfinished()
    assert engine.telemetry.num_steps_total == 0  # empty steps are not recorded
    assert time.perf_counter() - t0 < 5.0  # generous: only catches a sleep or a hang


def test_bad_input_is_rejected_clearly(tokenizer):
    engine, _ = make_engine(tokenizer)
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("a", [], SamplingParams())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request("a", [5, 10_000], SamplingParams())
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request("a", [1, -2], SamplingParams())
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request("a", [1] * 5000, SamplingParams())
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request("a", [1] * 4090, SamplingParams(max_tokens=100))
    with pytest.raises(ValueError, match="SamplingParams"):
        engine.add_request("a", "hi", {"max_tokens": 3})
    engine.add_request("a", "hi", SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="already running"):
        engine.add_request("a", "hi", SamplingParams())
    run_to_completion(engine)
    engine.add_request("a", "hi", SamplingParams(max_tokens=2))  # a finished id can be reused


def test_token_only_engine_refuses_text(tokenizer):
    engine, fake = make_engine(None)
    with pytest.raises(ValueError, match="tokenizer"):
        engine.add_request("a", "text", SamplingParams())
    with pytest.raises(ValueError, match="stop strings"):
        engine.add_request("a", [1, 2], SamplingParams(stop=("x",)))
    engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=4))
    outs = run_to_completion(engine)["a"]
    assert joined(outs) == ("", fake.reference_generate([1, 2, 3], 4))


def test_executor_failure_fails_its_requests_only(tokenizer):
    engine, fake = make_engine(tokenizer)
    real_execute = fake.execute
    calls = {"n": 0}

    def flaky(plan):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("device lost")
        return real_execute(plan)

    fake.execute = flaky
    engine.add_request("a", "hello", SamplingParams(max_tokens=5))
    outs = run_to_completion(engine)["a"]
    assert outs[-1].finish_reason == "error" and "device lost" in outs[-1].error
    assert engine.scheduler.stats().num_blocks_used == 0
    engine.add_request("b", "hello", SamplingParams(max_tokens=5))
    assert run_to_completion(engine)["b"][-1].finish_reason == "length"


def test_logprobs_pass_through(tokenizer):
    engine, fake = make_engine(tokenizer)
    real_execute = fake.execute

    def with_logprobs(plan):
        out = real_execute(plan)
        sampled = {
            r: SampledToken(t.token_id, logprob=-0.5, top_logprobs=((t.token_id, -0.5),))
            for r, t in out.sampled.items()
        }
        return StepOutput(out.step_id, sampled, out.forward_time_s)

    fake.execute = with_logprobs
    engine.add_request("a", "hi", SamplingParams(max_tokens=4, logprobs=1))
    outs = run_to_completion(engine)["a"]
    lps = [lp for o in outs if o.logprobs for lp in o.logprobs]
    assert [lp.token_id for lp in lps] == joined(outs)[1]
    assert all(lp.logprob == -0.5 for lp in lps)


def test_trace_file_has_steps_and_requests(tokenizer, tmp_path):
    rec = TelemetryRecorder()
    path = tmp_path / "trace.jsonl"
    rec.add_listener(TraceWriter(path))
    engine, _ = make_engine(tokenizer, telemetry=rec)
    engine.add_request("a", "trace me", SamplingParams(max_tokens=3))
    run_to_completion(engine)
    engine.close()
    records = list(read_trace(path))
    steps = [r for r in records if r["type"] == "step"]
    reqs = [r for r in records if r["type"] == "request"]
    assert len(steps) == engine.telemetry.num_steps_total and len(reqs) == 1
    assert reqs[0]["num_output_tokens"] == 3 and reqs[0]["ttft"] > 0


def test_undecodable_token_fails_only_that_request(tokenizer):
    """A model vocabulary larger than the tokenizer's: the request errors, the engine goes on."""
    engine, fake = make_engine(tokenizer, vocab_size=tokenizer.vocab_size + 50)
    prompt = tokenizer.encode("abc")
    ref = fake.reference_generate(prompt, 60, stop_ids=tokenizer.stop_token_ids)
    bad = next(i for i, t in enumerate(ref) if t >= tokenizer.vocab_size)  # before any EOS
    engine.add_request("a", prompt, SamplingParams(max_tokens=60))
    outs = run_to_completion(engine)["a"]
    assert outs[-1].finish_reason == "error" and "detokenizing" in outs[-1].error
    assert sum(len(o.new_token_ids) for o in outs) == bad
    assert engine.scheduler.stats().num_blocks_used == 0
    assert engine.telemetry.timeline("a").finish_reason == "error"
