"""Grammar compilation at admission (issue 31): StructuredOutputs.prepare builds the matcher
and its first mask off the step loop under a time budget, the step starts from them, and a
matcher that fails later reports the request unfinished (the engine then says "length")."""

from __future__ import annotations

import pytest

from cadence.core.plan import ScheduledChunk
from cadence.core.sampling_params import SamplingParams, StructuredOutputsParams
from cadence.executor.structured_output import StructuredOutputError, StructuredOutputs
from cadence.model.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def structured(tiny_llama_dir):
    tok = Tokenizer.from_hf_dir(tiny_llama_dir)
    return StructuredOutputs(tok, tok.vocab_size), tok


def _chunk(req_id: str, spec: StructuredOutputsParams, history: list[int],
           num_prompt: int) -> ScheduledChunk:
    return ScheduledChunk(req_id, (history[-1],), len(history) - 1, (0,), True,
                          SamplingParams(structured_outputs=spec), len(history) - num_prompt,
                          history=history, num_prompt_tokens=num_prompt)


def test_prepared_first_mask_is_the_step_mask(structured):
    so, tok = structured
    spec = StructuredOutputsParams(regex="(yes|no)")
    so.prepare("r1", spec)
    prompt = tok.encode("answer:")
    first = so.masks([_chunk("r1", spec, prompt, len(prompt))])[0]
    # The same mask as a matcher compiled in the step (an unprepared request).
    fresh = so.masks([_chunk("r2", spec, prompt, len(prompt))])[0]
    assert first.equal(fresh) and 0 < int(first.sum()) < tok.vocab_size
    allowed = int(first.nonzero()[0])
    # After a token the matcher moves on (the admission mask is not reused).
    second = so.masks([_chunk("r1", spec, prompt + [allowed], len(prompt))])[0]
    assert not second.equal(first)
    so.release("r1")
    so.release("r2")


def test_compile_past_its_budget_is_refused(structured):
    so, _ = structured
    with pytest.raises(StructuredOutputError, match="budget"):
        so.prepare("slow", StructuredOutputsParams(regex="a{10000}{10000}"), budget_s=0.0)
    assert "slow" not in so._prepared


def test_a_failing_matcher_leaves_the_request_unfinished(structured):
    """a{10000}{10000}: llguidance's lexer gives up after the first token; the mask then
    allows only EOS, and the request is reported unfinished (never a grammar "stop")."""
    so, tok = structured
    spec = StructuredOutputsParams(regex="a{10000}{10000}")
    so.prepare("big", spec, budget_s=600.0)
    prompt = tok.encode("go")
    first = so.masks([_chunk("big", spec, prompt, len(prompt))])[0]
    a_token = int(first.nonzero()[0])
    forced = so.masks([_chunk("big", spec, prompt + [a_token], len(prompt))])[0]
    assert set(forced.nonzero().flatten().tolist()) == set(tok.stop_token_ids)
    assert so.unfinished("big")
    so.release("big")


def test_a_complete_grammar_is_finished(structured):
    so, tok = structured
    spec = StructuredOutputsParams(regex="a")
    so.prepare("done", spec)
    prompt = tok.encode("go")
    mask = so.masks([_chunk("done", spec, prompt, len(prompt))])[0]
    so.masks([_chunk("done", spec, prompt + [int(mask.nonzero()[0])], len(prompt))])
    assert not so.unfinished("done")
    so.release("done")
