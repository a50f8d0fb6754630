"""Interjection: a short prompt that arrives while a long prompt's step computes runs between two
of that step's layers (SchedulerConfig.interject_short_prompts, LLMEngine.set_interjection_hooks).

On the FakeExecutor (its KV is checked: a step run in between that touched the paused step's
blocks changes that step's tokens) and on a tiny random Llama (greedy tokens identical to runs
without interjection): the short prompt's first token comes out of the step in progress, nothing
else changes.
"""

from __future__ import annotations

import pytest

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.request import Request
from cadence.core.sampling_params import SamplingParams
from cadence.core.scheduler import Scheduler
from cadence.engine.config import EngineConfig
from cadence.engine.llm_engine import LLMEngine
from cadence.executor.fake_executor import FakeExecutor
from tests.engine.conftest import fix_step_costs

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
# max_model_len 1000: prompts of at most 40 tokens are short (4 percent, as vLLM).
SHORT_MAX = 40


def fake_engine(**sched) -> tuple[LLMEngine, FakeExecutor]:
    knobs = dict(policy="chunked", max_num_batched_tokens=512, max_num_seqs=8, max_model_len=1000,
                 max_num_partial_prefills=2)
    knobs.update(sched)
    scheduler = Scheduler(SchedulerConfig(**knobs),
                          CacheConfig(block_size=4, num_blocks=400, enable_prefix_caching=True))
    fake = FakeExecutor(vocab_size=500)
    return LLMEngine.from_parts(scheduler, fake, None), fake


def ids(n: int, seed: int) -> list[int]:
    return [(seed * 37 + 11 * i) % 499 + 1 for i in range(n)]


class Arrivals:
    """The engine loop's role: adds `requests` at the first poll of a step in which `when`
    holds (default: the first poll), counting polls."""

    def __init__(self, engine: LLMEngine, requests, when=lambda: True):
        self.engine, self.requests, self.when = engine, list(requests), when
        self.polls = 0

    def __call__(self) -> None:
        self.polls += 1
        if self.requests and self.when():
            for req_id, prompt in self.requests:
                self.engine.add_request(req_id, prompt, GREEDY)
            self.requests = []


def run(engine: LLMEngine) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    for _ in range(1000):
        if not engine.has_unfinished():
            return tokens
        for out in engine.step():
            tokens.setdefault(out.req_id, []).extend(out.new_token_ids)
        engine.scheduler.check_integrity()
    raise AssertionError("engine did not finish")


def test_a_short_prompt_arriving_mid_step_gets_its_first_token_from_that_step():
    engine, fake = fake_engine()
    engine.add_request("stream", ids(8, 1), GREEDY)
    outs = engine.step()  # the stream is decoding
    engine.add_request("doc", ids(300, 2), GREEDY)
    arrivals = Arrivals(engine, [("chat", ids(20, 3))])
    engine.set_interjection_hooks(arrivals)
    outs_doc_step = engine.step()  # the document's step: the chat arrives during it
    outs += outs_doc_step
    assert arrivals.polls == fake.num_pause_points
    assert [o.req_id for o in outs_doc_step][0] == "chat"  # out first: it ended first
    assert len(outs_doc_step[0].new_token_ids) == 1
    assert engine.scheduler.num_interjections_total == 1
    # Its step is recorded on its own, inside the document's.
    steps = engine.telemetry.steps
    chat_step, doc_step = steps[-2], steps[-1]
    assert doc_step.t_start <= chat_step.t_start <= chat_step.t_end <= doc_step.t_end
    tokens = run(engine)
    for req_id, prompt in (("stream", ids(8, 1)), ("doc", ids(300, 2)), ("chat", ids(20, 3))):
        first = [t for o in outs if o.req_id == req_id for t in o.new_token_ids]
        assert first + tokens.get(req_id, []) == fake.reference_generate(prompt, 6), req_id


def test_interjected_outputs_go_to_emit_at_once():
    engine, _ = fake_engine()
    engine.add_request("doc", ids(300, 2), GREEDY)
    emitted = []
    engine.set_interjection_hooks(Arrivals(engine, [("chat", ids(10, 3))]),
                                  emit=lambda outs: emitted.append([o.req_id for o in outs]))
    outs = engine.step()
    assert emitted == [["chat"]]
    assert "chat" not in [o.req_id for o in outs]


@pytest.mark.parametrize("case", ["long prompt", "off", "one partial prefill", "seats full",
                                  "small step", "no hooks"])
def test_no_interjection_where_it_does_not_apply(case):
    sched = {"off": {"interject_short_prompts": False},
             "one partial prefill": {"max_num_partial_prefills": 1},
             "seats full": {"max_num_seqs": 1}}.get(case, {})
    engine, fake = fake_engine(**sched)
    doc = ids(30, 2) if case == "small step" else ids(300, 2)  # 30 tokens: not above short
    engine.add_request("doc", doc, GREEDY)
    chat = ids(SHORT_MAX + 1, 3) if case == "long prompt" else ids(10, 3)
    arrivals = Arrivals(engine, [("chat", chat)])
    if case != "no hooks":
        engine.set_interjection_hooks(arrivals)
    outs = engine.step()
    assert "chat" not in [o.req_id for o in outs]
    assert engine.scheduler.num_interjections_total == 0
    if arrivals.requests:  # never polled: the chat arrives after the step
        arrivals.when = lambda: True
        arrivals()
    tokens = run(engine)
    assert tokens["chat"] == fake.reference_generate(chat, 6)


def test_a_request_the_policy_passed_over_is_not_interjected():
    """Interjection serves arrivals: a short prompt already waiting when the step was planned
    (here: no seat for it) waits for the policy, even if a seat frees meanwhile."""
    engine, _ = fake_engine(max_num_seqs=1)
    engine.add_request("doc", ids(300, 2), GREEDY)
    engine.add_request("chat", ids(10, 3), GREEDY)
    engine.set_interjection_hooks(Arrivals(engine, []))
    engine.step()
    assert engine.scheduler.num_interjections_total == 0


def test_interjected_tokens_are_capped_by_the_paused_steps_own():
    """A flood of short prompts cannot hold a step up for longer than it computes itself."""
    engine, fake = fake_engine(max_num_batched_tokens=64, policy="chunked")
    engine.add_request("doc", ids(300, 2), GREEDY)  # 64-token chunks
    chats = [(f"chat{i}", ids(30, 10 + i)) for i in range(4)]
    fake.num_pause_points = 8
    engine.set_interjection_hooks(Arrivals(engine, chats))
    outs = engine.step()
    interjected = [o.req_id for o in outs if o.req_id.startswith("chat")]
    # 30 + 30 tokens reach the step's 64; the next chats wait for the next step.
    assert interjected == ["chat0", "chat1", "chat2"][:len(interjected)]
    assert 1 <= len(interjected) <= 3
    assert engine.scheduler._num_interjected_tokens <= 64 + 30
    run(engine)


def test_an_interjected_step_that_fails_fails_only_its_own_requests():
    engine, fake = fake_engine()
    engine.add_request("doc", ids(300, 2), GREEDY)
    real_execute = fake.execute

    def execute(plan, between_layers=None):
        if any(c.req_id == "chat" for c in plan.chunks):
            raise RuntimeError("boom")
        return real_execute(plan, between_layers)

    fake.execute = execute
    engine.set_interjection_hooks(Arrivals(engine, [("chat", ids(10, 3))]))
    outs = engine.step()
    chat = [o for o in outs if o.req_id == "chat"]
    assert chat and chat[0].finished and chat[0].finish_reason == "error"
    tokens = run(engine)
    doc_first = [o for o in outs if o.req_id == "doc"]
    assert len((doc_first[0].new_token_ids if doc_first else ()) + tuple(tokens["doc"])) == 6


def test_scheduler_keeps_the_paused_steps_blocks_and_takes_both_updates():
    sched = Scheduler(SchedulerConfig(policy="chunked", max_num_batched_tokens=512,
                                      max_model_len=1000, max_num_partial_prefills=2),
                      CacheConfig(block_size=4, num_blocks=400))
    sched.add_request(Request("doc", tuple(ids(300, 2)), GREEDY, 0.0))
    paused = sched.schedule()
    assert sched.may_interject(paused)
    assert sched.schedule_interjection(paused) is None  # nothing arrived
    sched.add_request(Request("chat", tuple(ids(10, 3)), GREEDY, 1.0))
    inter = sched.schedule_interjection(paused)
    assert [c.req_id for c in inter.chunks] == ["chat"] and inter.step_id > paused.step_id
    assert not set(inter.chunks[0].block_table) & set(paused.chunks[0].block_table)
    fake = FakeExecutor(vocab_size=500)
    sched.update(inter, fake.execute(inter))
    sched.update(paused, fake.execute(paused))
    sched.check_integrity()
    with pytest.raises(ValueError):
        sched.update(inter, fake.execute(inter))


# -- on a real model --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_loaded(tiny_llama_dir):
    from cadence.model.loader import load_model

    return load_model(tiny_llama_dir, dtype="float32", device="cpu")


def test_tiny_model_tokens_are_the_same_with_a_prompt_interjected(tiny_loaded):
    tok = tiny_loaded.tokenizer
    doc = tok.encode("Paged attention stores keys and values in fixed-size blocks. " * 12)
    stream = tok.encode("The quick brown fox jumps over the lazy dog.")
    chat = tok.encode("Hello world! How are you?")
    assert len(doc) > SHORT_MAX >= len(chat)

    def engine_run(interject: bool) -> tuple[dict[str, list[int]], int]:
        cfg = EngineConfig(scheduler=SchedulerConfig(
            policy="slo", max_model_len=1000, interject_short_prompts=interject),
            cache=CacheConfig(block_size=16, num_blocks=200), startup_profile=False)
        # The slo policy plans on its prior step-cost model: the document's first step must
        # be longer than a short prompt to be interjected into, and from a loaded host's
        # measured step times slo could plan it smaller.
        engine = fix_step_costs(LLMEngine.from_loaded(tiny_loaded, cfg))
        engine.add_request("stream", stream, GREEDY)
        first = run_until(engine, lambda: engine.scheduler.get_request("stream").num_output_tokens)
        engine.add_request("doc", doc, GREEDY)
        # The chat arrives during the document's first step (between its layers: a step with
        # prompt tokens polls either way, the caller answers /tokenize there) and runs
        # inside it, or (without interjection) after that step.
        arrivals = Arrivals(engine, [("chat", chat)])
        engine.set_interjection_hooks(arrivals)
        tokens = {}
        for out in engine.step():
            tokens.setdefault(out.req_id, []).extend(out.new_token_ids)
        assert arrivals.polls > 0
        assert ("chat" in tokens) == interject
        for req_id, more in run(engine).items():
            tokens.setdefault(req_id, []).extend(more)
        tokens["stream"] = first + tokens.get("stream", [])
        return tokens, engine.scheduler.num_interjections_total

    with_it, n_with = engine_run(True)
    without, n_without = engine_run(False)
    assert (n_with, n_without) == (1, 0)
    assert with_it == without
    assert all(len(t) == 6 for t in with_it.values())


def run_until(engine: LLMEngine, cond) -> list[int]:
    tokens: list[int] = []
    while not cond():
        for out in engine.step():
            tokens.extend(out.new_token_ids)
    return tokens
