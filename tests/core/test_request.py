from __future__ import annotations

import pytest

from cadence.core.request import Request, RequestStatus
from cadence.core.sampling_params import SamplingParams


def test_counters_follow_the_tokens():
    req = Request("a", [5, 6, 7], SamplingParams(max_tokens=4), arrival_time=1.5)
    assert (req.num_prompt_tokens, req.num_tokens, req.num_computed_tokens) == (3, 3, 0)
    assert req.status is RequestStatus.WAITING and req.finish_reason is None
    req.num_computed_tokens = 3
    req.append_output_token(9)
    assert req.num_tokens == 4 and req.num_output_tokens == 1
    assert list(req.all_token_ids) == [5, 6, 7, 9]
    assert req.num_remaining_tokens == 1 and req.is_prefill_done
    assert req.max_total_tokens == 7


def test_finish_sets_reason_and_message():
    req = Request("a", [1], SamplingParams(), arrival_time=0)
    req.set_finished(RequestStatus.FINISHED_ERROR, "too big")
    assert req.is_finished and req.finish_reason == "error" and req.error_message == "too big"
    with pytest.raises(ValueError):
        req.set_finished(RequestStatus.RUNNING)


@pytest.mark.parametrize("reason", ["stop", "length", "abort", "error"])
def test_finish_reasons_round_trip(reason):
    assert RequestStatus.from_finish_reason(reason).finish_reason == reason


def test_unknown_finish_reason_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown finish reason"):
        RequestStatus.from_finish_reason("cancelled")


@pytest.mark.parametrize(
    "req_id, prompt, match",
    [
        ("", [1], "req_id"),
        ("a", [], "must not be empty"),
        ("a", [1, -2], "ints >= 0"),
        ("a", [1, 2.0], "ints >= 0"),
    ],
)
def test_bad_requests_are_rejected(req_id, prompt, match):
    with pytest.raises(ValueError, match=match):
        Request(req_id, prompt, SamplingParams(), arrival_time=0)


def test_bad_priority_is_rejected():
    with pytest.raises(ValueError, match="priority"):
        Request("a", [1], SamplingParams(), arrival_time=0, priority=1.5)  # type: ignore[arg-type]
