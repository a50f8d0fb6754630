"""Per-request setup that grows with the request runs at admission, off the step loop, and is
bounded before it starts (issue 31): the stop-string matcher, bad words and the token-edit
tensors (logit_bias, allowed_token_ids) are built by admission.prepare in the admission
thread; add_request on the loop takes them as built; lists past their bounds are a 400."""

from __future__ import annotations

import pytest

from cadence.engine.admission import (MAX_LOGIT_BIAS_ENTRIES, MAX_STOP_CHARS, MAX_STOP_STRINGS,
                                      MAX_TOKEN_ID_LIST, AdmissionError, prepare)
from cadence.engine.wire import AddRequest


@pytest.fixture(scope="module")
def adapter(tiny_llama_dir):
    from cadence.core.config import CacheConfig
    from cadence.engine.config import EngineConfig
    from cadence.engine.llm_engine import LLMEngine
    from cadence.engine.llm_engine_adapter import LLMEngineAdapter

    engine = LLMEngine(EngineConfig(model=tiny_llama_dir, dtype="float32", device="cpu",
                                    startup_profile=False, cache=CacheConfig(num_blocks=64)))
    adapter = LLMEngineAdapter(engine, "tiny")
    yield adapter
    adapter.close()


def _msg(req_id: str, **sampling) -> AddRequest:
    return AddRequest(req_id, {"max_tokens": 6, "temperature": 0.0, **sampling},
                      prompt_text="The quick brown fox")


def test_setup_is_built_at_admission_and_taken_by_the_loop(adapter):
    engine = adapter.engine
    favourite = adapter.tokenize(" dog", add_special_tokens=False)[0]
    admitted = prepare(adapter, _msg("a", stop=["x" * 200, "never"],
                                     logit_bias=[[favourite, 100.0]]))
    # Built here, in the caller's (admission) thread: the matcher and the bias tensors.
    text, _ = engine._prepared_texts["a"]
    edits = engine.executor.token_edits["a"]
    assert edits.bias_ids.tolist() == [favourite] and edits.bias.tolist() == [100.0]
    adapter.add_request("a", admitted.prompt_token_ids, admitted.params, 0, None)
    assert engine._texts["a"] is text and "a" not in engine._prepared_texts
    outputs = []
    while engine.has_unfinished():
        outputs += [o for o in adapter.step() if o.req_id == "a"]
    assert [t for o in outputs for t in o.new_token_ids] == [favourite] * 6
    assert "a" not in engine.executor.token_edits  # released with the request


@pytest.mark.parametrize("field, value", [
    ("stop", ["s"] * (MAX_STOP_STRINGS + 1)),
    ("stop", ["s" * (MAX_STOP_CHARS + 1)]),
    ("logit_bias", [[1, 1.0]] * (MAX_LOGIT_BIAS_ENTRIES + 1)),
    ("stop_token_ids", [1] * (MAX_TOKEN_ID_LIST + 1)),
    ("bad_words", ["w"] * (MAX_TOKEN_ID_LIST + 1)),
])
def test_lists_past_their_bounds_are_refused_before_any_setup(adapter, field, value):
    with pytest.raises(AdmissionError) as exc:
        prepare(adapter, _msg("big", **{field: value}))
    assert exc.value.status == 400 and exc.value.param == field
    assert "big" not in adapter.engine._prepared_texts


def test_a_bad_word_of_several_tokens_is_resolved_at_admission(adapter):
    """vLLM's variants: the word without a leading space, and with one where that gives as
    many tokens starting with another one."""
    word = "antidisestablishmentarianism"
    admitted = prepare(adapter, _msg("bw", bad_words=[word]))
    plain = tuple(adapter.tokenize(word, add_special_tokens=False))
    spaced = tuple(adapter.tokenize(" " + word, add_special_tokens=False))
    assert len(plain) > 1 and admitted.params.bad_words_token_ids == ()
    want = [plain] + ([spaced] if len(spaced) == len(plain) and spaced[0] != plain[0] else [])
    assert list(admitted.params.bad_words_sequences) == want
    assert admitted.params.needs_history  # the ban depends on the output so far
