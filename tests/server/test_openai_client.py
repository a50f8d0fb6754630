"""OpenAI-client code against `cadence serve`, as OpenAI's and vLLM's docs write it.

Regression tests for results that differed from vLLM's (issue 32): usage with n > 1,
min_tokens with stop strings, stream_options.continuous_usage_stats. (stop_token_ids text: tests/engine/test_vllm_regressions.py,
the same engine code.)
"""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")

PROMPT = "The quick brown fox jumps over the lazy dog, and then the dog"


def test_cached_tokens_never_exceed_prompt_tokens_with_n(client, model):
    for _ in range(2):  # the second time the whole prompt may come from the prefix cache
        out = client.completions.create(model=model, prompt=PROMPT, n=3, max_tokens=4,
                                        temperature=0.8, seed=1)
        usage = out.usage
        assert len(out.choices) == 3 and usage.completion_tokens == 12
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        assert 0 <= cached <= usage.prompt_tokens
    assert cached > 0  # the repeated prompt did hit the cache, counted once


def test_chat_stream_usage_with_n(client, model):
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], n=2, max_tokens=3,
        stream=True, stream_options={"include_usage": True})
    usage = [c.usage for c in stream if c.usage is not None][-1]
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    assert cached <= usage.prompt_tokens and usage.completion_tokens == 6


def test_continuous_usage_stats_puts_usage_on_every_chunk(client, model):
    stream = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True})
    chunks = list(stream)
    with_text = [c for c in chunks if c.choices]
    assert with_text and all(c.usage is not None for c in with_text)
    counts = [c.usage.completion_tokens for c in with_text]
    assert counts == sorted(counts) and counts[-1] == 5
    assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
               for c in with_text)
    assert chunks[-1].usage.completion_tokens == 5  # the include_usage chunk still comes last


def test_unknown_stream_option_is_refused(client, model):
    with pytest.raises(openai.BadRequestError, match="stream_options"):
        client.completions.create(model=model, prompt=PROMPT, max_tokens=2, stream=True,
                                  stream_options={"include_usage": True, "bogus": 1})


def _greedy(client, model, **extra):
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                    extra_body={"ignore_eos": True, **extra})
    return out.choices[0]


def test_min_tokens_holds_back_stop_strings(client, model):
    plain = _greedy(client, model)
    first_word = plain.text[:max(1, plain.text.find(" ", 1))]
    early = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                      stop=[first_word], extra_body={"ignore_eos": True})
    assert early.choices[0].text == ""
    held = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                     stop=[first_word],
                                     extra_body={"ignore_eos": True, "min_tokens": 3})
    assert held.usage.completion_tokens >= 3
    assert held.choices[0].text.startswith(first_word)


def test_the_model_path_as_given_is_a_model_name(client, tiny_llama_dir):
    """As with vLLM, a client may send the path the server was started with."""
    out = client.completions.create(model=tiny_llama_dir, prompt="Hi", max_tokens=2)
    assert out.choices and out.model == client.models.list().data[0].id
