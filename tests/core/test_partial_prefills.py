"""Several prompts in prefill at once, short ones first (vLLM's --max-num-partial-prefills,
--max-long-partial-prefills, --long-prefill-token-threshold)."""

from __future__ import annotations

import pytest
from core_driver import VOCAB, RequestSpec, make_request, make_scheduler, run, step

from cadence.executor.fake_executor import FakeExecutor


def doc_then_chat(policy: str, partial: int, budget: int = 64):
    # threshold 0: no per-request chunk cap; "long" means over 4 percent of max_model_len.
    scheduler = make_scheduler(policy, budget=budget, threshold=0, partial_prefills=partial,
                               max_model_len=4096)
    executor = FakeExecutor(VOCAB)
    scheduler.add_request(make_request("doc", range(3, 403), max_tokens=2, ignore_eos=True))
    step(scheduler, executor)
    step(scheduler, executor)  # the document is part-way through its prompt
    scheduler.add_request(make_request("chat", [5] * 10, max_tokens=2, ignore_eos=True,
                                       arrival_time=1.0))
    steps = 0
    while scheduler.get_request("chat").num_output_tokens == 0:
        step(scheduler, executor)
        steps += 1
    return scheduler, steps


@pytest.mark.parametrize("policy", ["chunked", "slo"])
def test_a_short_prompt_overtakes_a_long_prefill(policy):
    _, steps_alone_in_line = doc_then_chat(policy, partial=1)
    scheduler, steps = doc_then_chat(policy, partial=4)
    assert steps == 1, "the chat message gets its first token in the next step"
    assert steps_alone_in_line > 3, "with one partial prefill it waits for the document"
    assert scheduler.get_request("doc").num_computed_tokens < 400


def test_long_prompts_wait_for_a_long_slot_but_short_ones_do_not():
    scheduler = make_scheduler("chunked", budget=64, threshold=32, partial_prefills=3,
                               long_partial_prefills=1, max_model_len=4096)
    executor = FakeExecutor(VOCAB)
    scheduler.add_request(make_request("doc1", [7] * 300, max_tokens=2, arrival_time=0.0))
    scheduler.add_request(make_request("doc2", [8] * 300, max_tokens=2, arrival_time=1.0))
    scheduler.add_request(make_request("chat", [9] * 8, max_tokens=2, arrival_time=2.0))
    plan, _ = step(scheduler, executor)
    ids = [c.req_id for c in plan.chunks]
    # chat overtakes doc2 (one long slot, taken by doc1); doc1 continues with the rest.
    assert "chat" in ids and "doc1" in ids and "doc2" not in ids
    assert ids.index("chat") < ids.index("doc1")


def test_the_partial_prefill_cap_holds():
    scheduler = make_scheduler("chunked", budget=200, threshold=32, partial_prefills=2,
                               long_partial_prefills=2, max_model_len=4096)
    executor = FakeExecutor(VOCAB)
    for i in range(4):
        scheduler.add_request(make_request(f"p{i}", [10 + i] * 20, max_tokens=2,
                                           arrival_time=float(i)))
    plan, _ = step(scheduler, executor)
    assert [c.req_id for c in plan.chunks] == ["p0", "p1"]


@pytest.mark.parametrize("policy", ["chunked", "slo"])
def test_outputs_do_not_change_when_short_prompts_overtake(policy):
    specs = [RequestSpec("doc", list(range(3, 300)), 6, arrival_step=0)]
    specs += [RequestSpec(f"chat{i}", [20 + i] * (5 + i), 5, arrival_step=1 + 2 * i)
              for i in range(5)]
    overtaking = run(make_scheduler(policy, budget=48, threshold=16, partial_prefills=4,
                                    block_size=4, num_blocks=120), FakeExecutor(VOCAB), specs)
    in_line = run(make_scheduler(policy, budget=4096, partial_prefills=1, num_blocks=4096),
                  FakeExecutor(VOCAB), specs)
    assert overtaking.outputs == in_line.outputs


@pytest.mark.parametrize("policy", ["chunked", "slo"])
def test_a_short_prompts_step_leaves_the_long_prefill_out_but_never_starves_it(policy):
    scheduler = make_scheduler(policy, budget=64, threshold=0, partial_prefills=4,
                               max_model_len=4096)
    executor = FakeExecutor(VOCAB)
    scheduler.add_request(make_request("doc", range(3, 403), max_tokens=2, ignore_eos=True))
    step(scheduler, executor)  # the document is in prefill
    scheduler.add_request(make_request("chat", [5] * 10, max_tokens=2, ignore_eos=True,
                                       arrival_time=1.0))
    plan, _ = step(scheduler, executor)
    # The chat's first token comes from a step without a document chunk (a short step).
    assert [c.req_id for c in plan.chunks] == ["chat"]
    plan, _ = step(scheduler, executor)
    assert "doc" in [c.req_id for c in plan.chunks]
    # A short prompt arriving before every step: the document still gets every other step.
    doc_steps = 0
    for i in range(8):
        scheduler.add_request(make_request(f"c{i}", [6 + i] * 8, max_tokens=1, ignore_eos=True,
                                           arrival_time=2.0 + i))
        plan, _ = step(scheduler, executor)
        doc_steps += "doc" in [c.req_id for c in plan.chunks]
    assert doc_steps >= 4
