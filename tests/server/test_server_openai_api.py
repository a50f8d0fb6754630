"""The OpenAI API against a real server on the tiny random Llama, with the official client."""

from __future__ import annotations

import os

import pytest

PROMPT = "The quick brown fox jumps over the lazy dog."


def _stream_text(stream) -> tuple[str, str | None, object]:
    text, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
            assert chunk.choices == []
            continue
        choice = chunk.choices[0]
        if hasattr(choice, "delta"):
            text.append(choice.delta.content or "")
        else:
            text.append(choice.text)
        finish = choice.finish_reason or finish
    return "".join(text), finish, usage


def test_models_lists_the_served_model(client, model, tiny_llama_dir):
    models = client.models.list().data
    # Default served name: the model folder's name.
    assert [m.id for m in models] == [os.path.basename(tiny_llama_dir)]
    assert models[0].object == "model"


def test_completion_usage_counts_real_tokens(client, model, tiny_tokenizer):
    resp = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert resp.object == "text_completion"
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.prompt_tokens == len(tiny_tokenizer.encode(PROMPT))
    assert resp.usage.completion_tokens == 8
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 8


def test_streaming_completion_matches_non_streaming(client, model):
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
    stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    text, finish, usage = _stream_text(stream)
    assert text == whole.choices[0].text
    assert finish == whole.choices[0].finish_reason
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_token_id_prompt(client, model, tiny_tokenizer):
    ids = tiny_tokenizer.encode(PROMPT)
    by_ids = client.completions.create(model=model, prompt=ids, max_tokens=6, temperature=0)
    by_text = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0)
    assert by_ids.usage.prompt_tokens == len(ids)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_chat_completion_streaming_and_not(client, model, tiny_tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=10,
                                           temperature=0, extra_body={"ignore_eos": True})
    rendered = tiny_tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    assert whole.usage.prompt_tokens == len(tiny_tokenizer.encode(rendered,
                                                                  add_special_tokens=False))
    assert whole.usage.completion_tokens == 10
    stream = client.chat.completions.create(
        model=model, messages=messages, max_completion_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-2].choices[0].finish_reason == "length"


def test_seed_reproducible(client, model):
    def sample(seed: int) -> str:
        return client.completions.create(model=model, prompt=PROMPT, max_tokens=16,
                                          temperature=1.0, seed=seed,
                                          extra_body={"ignore_eos": True}).choices[0].text

    assert sample(1234) == sample(1234)
    assert len({sample(1), sample(2), sample(3)}) > 1


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_exactly(client, model, stream):
    full = client.completions.create(model=model, prompt=PROMPT, max_tokens=40, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    # A stop string of two plain characters from the middle of the greedy text.
    start = next(i for i in range(len(full) // 3, len(full) - 2)
                 if full[i:i + 2].isprintable() and "\ufffd" not in full[i:i + 2])
    stop = full[start:start + 2]
    expected = full[: full.find(stop)]
    kwargs = dict(model=model, prompt=PROMPT, max_tokens=40, temperature=0, stop=[stop, "\x00"],
                  extra_body={"ignore_eos": True})
    if stream:
        text, finish, _ = _stream_text(client.completions.create(stream=True, **kwargs))
    else:
        resp = client.completions.create(**kwargs)
        text, finish = resp.choices[0].text, resp.choices[0].finish_reason
    assert text == expected
    assert finish == "stop"


def test_completion_logprobs(client, model):
    resp = client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0,
                                     logprobs=2, extra_body={"ignore_eos": True})
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 5
    assert all(v <= 0 for v in lp.token_logprobs)
    assert all(1 <= len(top) <= 2 for top in lp.top_logprobs)
    # Greedy: the sampled token is the most likely one.
    assert all(abs(max(top.values()) - v) < 1e-4 for top, v in zip(lp.top_logprobs,
                                                                     lp.token_logprobs))


def test_chat_logprobs(client, model):
    resp = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0,
        logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = resp.choices[0].logprobs.content
    assert len(content) == 4
    assert all(len(e.top_logprobs) == 3 and e.logprob <= 0 for e in content)
