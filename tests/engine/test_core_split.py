"""--core-split: prefill chunks on one thread team, decode steps on another, one KV pool.

On the FakeExecutor (its KV is checked: a block written by the wrong stream changes tokens)
and on a tiny random Llama in float32 (both teams run real forwards at once): the tokens are
those of a colocated run, the split changes mid-request, a request moves to the decode stream
by its first token alone, an abort during its chunk keeps its blocks until the chunk ends, and
with one core the engine steps exactly as the colocated default does.
"""

from __future__ import annotations

import dataclasses

import threading

import pytest

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.sampling_params import SamplingParams
from cadence.core.scheduler import Scheduler
from cadence.engine.config import EngineConfig
from cadence.engine.llm_engine import LLMEngine
from cadence.engine.split_stepper import SplitStepper
from cadence.executor.fake_executor import FakeExecutor

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def fake_engine(split_cores: int | None, executor=None, **sched) -> tuple[LLMEngine, FakeExecutor]:
    knobs = dict(policy="chunked", max_num_batched_tokens=64, max_num_seqs=8,
                 max_model_len=1000, split_prefill_chunk=48)
    knobs.update(sched)
    scheduler = Scheduler(SchedulerConfig(**knobs),
                          CacheConfig(block_size=4, num_blocks=400, enable_prefix_caching=True))
    fake = executor or FakeExecutor(vocab_size=500)
    engine = LLMEngine.from_parts(scheduler, fake, None)
    if split_cores is not None:
        engine.enable_core_split(split_cores, pin=False)
    return engine, fake


def ids(n: int, seed: int) -> list[int]:
    return [(seed * 37 + 11 * i) % 499 + 1 for i in range(n)]


def drive(engine: LLMEngine, events=()):
    """Step until done. `events`: (condition, requests) in order; each event's requests are
    added before the first step at which its condition(engine, step index) holds, after the
    event before it. Returns tokens per request."""
    events = list(events)
    tokens: dict[str, list[int]] = {}
    for k in range(5000):
        while events and events[0][0](engine, k):
            for req_id, prompt in events.pop(0)[1]:
                engine.add_request(req_id, prompt, GREEDY)
        if not events and not engine.has_unfinished():
            return tokens
        for out in engine.step():
            tokens.setdefault(out.req_id, []).extend(out.new_token_ids)
        engine.scheduler.check_integrity()
    raise AssertionError("engine did not finish")


def at(step: int):
    return lambda engine, k: k >= step


def decoding(req_id: str, num_tokens: int = 2):
    """Once `req_id` has `num_tokens` output tokens (its prompt is done, and a step ran since
    it was handed over)."""
    def cond(engine, k):
        req = engine.scheduler.get_request(req_id)
        return req is None or req.num_output_tokens >= num_tokens
    return cond


# Two streams, a document (the split starts), a stream arriving during it; when the document
# decodes (colocated again: no prompt waits), another stream and then a second document (the
# split starts again while the first streams still decode).
WORKLOAD = [
    (at(0), [("s1", ids(10, 1)), ("s2", ids(7, 2))]),
    (at(3), [("doc", ids(160, 3))]),
    (at(5), [("s3", ids(9, 4))]),
    (decoding("doc"), [("s4", ids(6, 6))]),
    (decoding("s4"), [("doc2", ids(100, 5))]),
]


class SlowFake(FakeExecutor):
    """Prompt chunks take a while (so decodes run beside them); counts steps that overlap."""

    def __init__(self) -> None:
        super().__init__(vocab_size=500)
        self._lock = threading.Lock()
        self.active = 0
        self.max_active = 0

    def execute(self, plan, between_layers=None):
        import time

        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            time.sleep(0.005 if plan.num_prefill_tokens > 16 else 0.001)
            return super().execute(plan)
        finally:
            with self._lock:
                self.active -= 1


def test_split_tokens_equal_colocated_and_steps_overlap():
    colocated, _ = fake_engine(None)
    expected = drive(colocated, WORKLOAD)
    engine, fake = fake_engine(2, executor=SlowFake())
    got = drive(engine, WORKLOAD)
    assert got == expected
    assert all(len(t) == 12 for t in got.values())
    split = engine.split_stepper.split
    # Split while the documents prefilled, colocated between and after: several changes.
    assert split.num_changes >= 3
    assert fake.max_active == 2  # a decode step ran while a prompt chunk computed
    # Each document was prefilled in chunks of at most split_prefill_chunk on the prefill team.
    doc_chunks = [(s, e) for r, s, e in fake.computed if r == "doc"]
    assert doc_chunks[0][0] == 0 and all(e - s <= 64 for s, e in doc_chunks)


def test_one_core_steps_exactly_as_colocated():
    colocated, fake_a = fake_engine(None)
    expected = drive(colocated, WORKLOAD)
    engine, fake_b = fake_engine(1)
    got = drive(engine, WORKLOAD)
    assert got == expected
    assert fake_b.computed == fake_a.computed  # the same steps, in the same order
    assert engine.split_stepper.split.num_changes == 0


def test_a_request_aborted_during_its_chunk_keeps_its_blocks_until_the_chunk_ends():
    gate = threading.Event()

    class GatedFake(FakeExecutor):
        def execute(self, plan, between_layers=None):
            if plan.num_prefill_tokens > 16:
                assert gate.wait(5)
            return super().execute(plan)

    engine, fake = fake_engine(2, executor=GatedFake(vocab_size=500))
    engine.add_request("s1", ids(10, 1), GREEDY)
    outs = engine.step()  # colocated: s1 prefilled, decoding
    engine.add_request("doc", ids(200, 3), GREEDY)
    outs += engine.step()  # split: doc's first chunk starts on the prefill team (at the gate)
    sched = engine.scheduler
    assert sched.prefill_in_flight
    assert engine.abort_request("doc")
    assert sched.kv.holds_blocks("doc")  # not freed under the prefill team's writes
    outs += engine.step()  # a decode step beside it
    sched.check_integrity()
    gate.set()
    while sched.prefill_in_flight:
        outs += engine.step()
    assert not sched.kv.holds_blocks("doc")
    sched.check_integrity()
    assert not [o for o in outs if o.req_id == "doc" and o.new_token_ids]
    s1 = [t for o in outs if o.req_id == "s1" for t in o.new_token_ids]
    s1 += drive(engine).get("s1", [])
    assert len(s1) == 12


@pytest.fixture(scope="module")
def tiny_loaded(tiny_llama_d64_dir):
    from cadence.model.loader import load_model

    return load_model(tiny_llama_d64_dir, dtype="float32", device="cpu")


def test_tiny_model_greedy_tokens_equal_colocated_with_split_changes(tiny_loaded):
    tok = tiny_loaded.tokenizer
    doc = tok.encode("Paged attention stores keys and values in fixed-size blocks. " * 10)
    doc2 = tok.encode("Continuous batching mixes prefill chunks with decode steps. " * 8)
    streams = [tok.encode(t) for t in ("The quick brown fox jumps.", "Hello world! How are you?",
                                       "def forward(self, x):")]
    workload = [(at(0), [("s0", streams[0]), ("s1", streams[1])]), (at(2), [("doc", doc)]),
                (at(4), [("s2", streams[2])]), (decoding("doc"), [("doc2", doc2)])]

    def engine_run(split: bool):
        cfg = EngineConfig(scheduler=SchedulerConfig(
            policy="chunked", max_model_len=1000, max_num_batched_tokens=64,
            split_prefill_chunk=40, core_split="auto" if split else "off"),
            cache=CacheConfig(block_size=16, num_blocks=200), startup_profile=False)
        engine = LLMEngine.from_loaded(tiny_loaded, cfg)
        if split:
            engine.enable_core_split(2, pin=False)
        tokens = drive(engine, workload)
        changes = engine.split_stepper.split.num_changes if split else 0
        engine.close()
        return tokens, changes

    colocated, _ = engine_run(False)
    split, changes = engine_run(True)
    assert changes >= 3  # split for each document, colocated between: mid-request for streams
    assert split == colocated
    assert all(len(t) == 12 for t in split.values())
    # --policy adaptive (slo chunks colocated, the split enabled by the config itself): the
    # same tokens as the colocated chunked run.
    cfg = EngineConfig(scheduler=SchedulerConfig(
        policy="adaptive", max_model_len=1000, split_prefill_chunk=40),
        cache=CacheConfig(block_size=16, num_blocks=200), startup_profile=False)
    engine = LLMEngine.from_loaded(tiny_loaded, cfg)
    engine._split_cores = 2  # this host may have one core; the test wants two teams
    assert drive(engine, workload) == colocated
    assert engine.split_stepper.interleave and engine.split_stepper.split.num_changes >= 1
    engine.close()
    # adaptive's default is 'interleave' (decode steps between two layers of the prompt
    # chunks); on split cores (auto) the tokens are the same too.
    cfg = dataclasses.replace(cfg, scheduler=SchedulerConfig(
        policy="adaptive", max_model_len=1000, split_prefill_chunk=40, core_split="auto"))
    engine = LLMEngine.from_loaded(tiny_loaded, cfg)
    engine._split_cores = 2
    assert drive(engine, workload) == colocated
    assert not engine.split_stepper.interleave
    engine.close()


def test_split_stats_reach_prometheus_and_the_trace(tmp_path):
    from cadence.engine.llm_engine_adapter import LLMEngineAdapter
    from cadence.telemetry.prometheus import PrometheusMetrics
    from cadence.telemetry.trace_writer import TraceWriter, read_trace

    engine, fake = fake_engine(2, executor=SlowFake())
    trace = tmp_path / "trace.jsonl"
    engine.telemetry.add_listener(TraceWriter(trace))
    drive(engine, WORKLOAD[:3])
    split = engine.split_stepper
    split.UTILISATION_WINDOW_S = 0.0  # every read closes a window
    stats = split.stats()
    assert stats["num_core_split_changes_total"] == split.split.num_changes >= 2
    assert 0.0 <= stats["decode_team_utilisation"] <= 1.0
    adapter = LLMEngineAdapter.__new__(LLMEngineAdapter)
    adapter.engine = engine
    metrics = PrometheusMetrics("m")
    metrics.update_engine_stats(adapter.stats())
    text = metrics.render().decode()
    for name in ("core_split_prefill_threads", "core_split_decode_threads",
                 "core_split_prefill_team_utilisation", "core_split_decode_team_utilisation",
                 "core_split_changes_total"):
        assert f"cadence:{name}{{" in text
    engine.close()
    events = [r for r in read_trace(trace) if r.get("type") == "core_split"]
    assert len(events) == split.split.num_changes
    assert events[0]["prefill_threads"] == 1 and events[0]["decode_threads"] == 1
    assert events[-1]["prefill_threads"] == 0


def test_auto_overlaps_the_teams_and_paces_decode_steps_when_they_are_short():
    import time

    class Timed(SlowFake):
        def __init__(self):
            super().__init__()
            self.decode_starts = []

        def execute(self, plan, between_layers=None):
            if plan.num_prefill_tokens == 0:
                self.decode_starts.append(time.perf_counter())
            elif plan.num_prefill_tokens > 16:
                time.sleep(0.1)  # chunks long enough for several paced decode steps
            return super().execute(plan, between_layers)

    expected = drive(fake_engine(None)[0], WORKLOAD)
    engine, fake = fake_engine(2, executor=Timed(), core_split="auto", target_itl_ms=50.0)
    got = drive(engine, WORKLOAD)
    assert got == expected
    stepper = engine.split_stepper
    # ~1 ms decode steps on the prefill team's cores, far below the 50 ms target: the chunks
    # had both cores, the decode thread on top.
    assert stepper.num_overlapped_decode_steps > 0
    starts = fake.decode_starts
    gaps = sorted(b - a for a, b in zip(starts, starts[1:]))
    assert gaps[-1] >= stepper.PACE * 0.05 * 0.9  # paced to the target while overlapped
    engine.close()


def test_closing_a_split_engine_restores_the_loop_threads_count_and_gil_interval():
    import sys

    import torch

    before = torch.get_num_threads()
    interval = sys.getswitchinterval()
    engine, _ = fake_engine(2, executor=SlowFake())
    assert sys.getswitchinterval() <= SplitStepper.GIL_SWITCH_S
    drive(engine, WORKLOAD[:3])
    engine.close()
    assert torch.get_num_threads() == before
    assert sys.getswitchinterval() == interval


def test_auto_prefills_a_lone_prompt_in_chunks_so_a_chat_arriving_meanwhile_streams():
    class Slow(SlowFake):
        def execute(self, plan, between_layers=None):
            if plan.num_prefill_tokens > 16:
                import time

                time.sleep(0.03)
            return super().execute(plan, between_layers)

    engine, fake = fake_engine(2, executor=Slow(), core_split="auto")
    engine.add_request("doc", ids(300, 3), GREEDY)
    tokens: dict[str, list[int]] = {}
    order = []
    for k in range(2000):
        if k == 1:
            engine.add_request("chat", ids(8, 4), GREEDY)
        if k > 1 and not engine.has_unfinished():
            break
        for out in engine.step():
            if out.new_token_ids:
                tokens.setdefault(out.req_id, []).extend(out.new_token_ids)
                order.append(out.req_id)
        engine.scheduler.check_integrity()
    # The chat's first tokens came while the document was still prefilling (no colocated step
    # of the whole document held them), and every token is what a colocated run gives.
    assert order.index("doc") > order.index("chat") + 1
    colocated, _ = fake_engine(None)
    assert tokens == drive(colocated, [(at(0), [("doc", ids(300, 3))]),
                                       (at(1), [("chat", ids(8, 4))])])
    engine.close()


def test_adaptive_policy_tokens_equal_the_colocated_default_and_one_core_never_splits():
    """--policy adaptive: slo steps colocated, split cores while prompts wait and requests
    decode. Its tokens are the colocated slo run's; with one core it never splits (each turn is
    the colocated slo step)."""
    slo, _ = fake_engine(None, policy="slo", max_num_batched_tokens=64)
    expected = drive(slo, WORKLOAD)
    engine, fake = fake_engine(2, executor=SlowFake(), policy="adaptive",
                               max_num_batched_tokens=64)
    assert engine.scheduler.sched.core_split == "interleave"
    got = drive(engine, WORKLOAD)
    assert engine.split_stepper.interleave  # one team: chunks and decode steps on one thread
    assert got == expected
    assert engine.split_stepper.split.num_changes >= 3 and fake.max_active == 1
    one, fake_one = fake_engine(1, executor=SlowFake(), policy="adaptive",
                                max_num_batched_tokens=64)
    assert drive(one, WORKLOAD) == expected
    assert one.split_stepper.split.num_changes == 0 and fake_one.max_active == 1


def test_interleave_steps_decodes_between_the_layers_of_a_prompt_chunk():
    """--core-split interleave: one thread; the decode stream's steps run inside the prompt
    chunk's forward, between two of its layers, paced to the target; tokens as colocated."""
    import time

    class Layered(FakeExecutor):
        can_pause = True

        def __init__(self):
            super().__init__(vocab_size=500)
            self.depth = 0
            self.nested_decodes = 0

        def execute(self, plan, between_layers=None):
            if self.depth and plan.num_prefill_tokens == 0:
                self.nested_decodes += 1
            self.depth += 1
            try:
                for _ in range(4 if plan.num_prefill_tokens > 16 else 0):
                    time.sleep(0.003)  # a layer
                    if between_layers is not None:
                        between_layers()
                return super().execute(plan)
            finally:
                self.depth -= 1

    colocated, _ = fake_engine(None)
    expected = drive(colocated, WORKLOAD)
    fake = Layered()
    engine, _ = fake_engine(2, executor=fake, core_split="interleave", target_itl_ms=5.0)
    assert drive(engine, WORKLOAD) == expected
    assert engine.split_stepper.interleave and fake.nested_decodes >= 3


def test_interleave_reports_the_pace_as_the_reachable_target_where_the_bound_sets_it():
    """A decode step too slow for the ITL target within --max-prefill-slowdown's share: the
    pace keeps the bound (core/interleave_pace.py), and the gap it gives the streams is the
    reachable target the engine reports; with a loose bound the target is met, none reported."""
    import time

    from cadence.core.interleave_pace import BOUND_SHARE

    class SlowSteps(FakeExecutor):
        can_pause = True

        def execute(self, plan, between_layers=None):
            if plan.num_prefill_tokens == 0:
                time.sleep(0.004)  # a decode step: 4 ms against a 20 ms target
            for _ in range(6 if plan.num_prefill_tokens > 16 else 0):
                time.sleep(0.003)  # a layer
                if between_layers is not None:
                    between_layers()
            return super().execute(plan)

    def run(slowdown: float):
        engine, _ = fake_engine(2, executor=SlowSteps(vocab_size=500), core_split="interleave",
                                target_itl_ms=20.0, max_prefill_slowdown=slowdown)
        drive(engine, WORKLOAD)
        stepper = engine.split_stepper
        engine.close()
        return stepper

    bound = run(1.15)
    step = bound._paused_decode_s
    assert step is not None and bound.pace_s() == pytest.approx(step * (1 + 1 / (BOUND_SHARE * 0.15)))
    # The reported pace is the latest chunk's (the step's average moved by its own steps since).
    reported = bound.stats()["itl_target_reachable_s"]
    assert reported > 0.020 and reported == pytest.approx(bound.pace_s(), rel=0.25)
    loose = run(3.0)  # shares up to 1.6: the target's (a 16 ms pace)
    assert loose.pace_s() == pytest.approx(0.016)
    assert "itl_target_reachable_s" not in loose.stats()


def test_interleave_runs_decode_steps_between_row_blocks_of_a_layer(monkeypatch, tiny_llama_d64_dir):
    """--core-split interleave on a model whose layers compute each row alone (int8 packed
    GEMMs, the paged attention kernel): the prompt chunk's ops run over row blocks, decode steps
    run between two blocks of one layer's op, and the tokens are the colocated run's."""
    from cadence.core import interleave_pace
    from cadence.model.fused_decode import has_f32_stack
    from cadence.model.kernels.cpu_ops import load_cpu_kernels
    from cadence.model.loader import load_model
    from cadence.model.pause_points import PausePoints

    kernels = load_cpu_kernels()
    if kernels is None or not has_f32_stack(kernels):
        pytest.skip("needs the CPU kernels built for a tier with AVX2 and FMA")
    loaded = load_model(tiny_llama_d64_dir, dtype="float32", device="cpu", quantization="int8")
    tok = loaded.tokenizer
    doc = tok.encode("Paged attention stores keys and values in fixed-size blocks. " * 12)
    streams = [tok.encode(t) for t in ("The quick brown fox jumps.", "Hello world! How are you?")]
    workload = [(at(0), [("s0", streams[0]), ("s1", streams[1])]), (decoding("s1"), [("doc", doc)])]

    def engine_run(core_split: str):
        cfg = EngineConfig(scheduler=SchedulerConfig(
            policy="adaptive", max_model_len=1000, split_prefill_chunk=40, core_split=core_split,
            target_itl_ms=0.5, max_prefill_slowdown=100.0), cache=CacheConfig(block_size=16, num_blocks=200), startup_profile=False)
        engine = LLMEngine.from_loaded(loaded, cfg)
        engine._split_cores = 2
        tokens = drive(engine, workload)
        stepper = engine.split_stepper
        engine.close()
        return tokens, stepper

    colocated, _ = engine_run("off")
    # Blocks of 16 rows; a pace of 0.4 ms (or a step's time: the loose prompt slowdown bound
    # lets the target's share past 1): a decode step is due at nearly every pause point.
    monkeypatch.setattr(interleave_pace, "ROW_BLOCK", 16)
    monkeypatch.setattr(interleave_pace, "MIN_ROW_BLOCK", 16)
    # The decode steps that ran at a pause between two row blocks (the stepper counts them all).
    steppers: list[SplitStepper] = []
    inside_decodes = []
    inside, original_init = PausePoints.inside, SplitStepper.__init__

    def counted(points):
        before = steppers[-1].num_overlapped_decode_steps
        inside(points)
        if steppers[-1].num_overlapped_decode_steps > before:
            inside_decodes.append(points.row_block)

    def remember(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        steppers.append(self)

    monkeypatch.setattr(PausePoints, "inside", counted)
    monkeypatch.setattr(SplitStepper, "__init__", remember)
    interleaved, stepper = engine_run("interleave")
    assert interleaved == colocated
    assert stepper.interleave and stepper._rows_split
    assert len(inside_decodes) >= 3
