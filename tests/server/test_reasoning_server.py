"""--reasoning-parser end to end: `cadence serve` on the tiny random model, read with the
official openai client. The random model's text is made deterministic two ways: guided_choice
holds a reply to a given text with think tags (a reply held to a grammar that opens a block
is split as any other), and a free greedy reply under deepseek_r1 (whose template opens the
block in the prompt) is all reasoning, whatever its words, on every route alike."""

from __future__ import annotations

import json

import pytest

from server_harness import openai_client, start_server, tiny_model_args

CALL = '<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}}}}}]
ASK = [{"role": "user", "content": "What time is it?"}]
THOUGHT = f"<think>Maybe I call {CALL} first.</think>It is noon."


@pytest.fixture(scope="module")
def reasoning_server(tiny_llama_dir, tmp_path_factory):
    server = start_server(str(tmp_path_factory.mktemp("server")),
                          *tiny_model_args(tiny_llama_dir), "--reasoning-parser", "deepseek_r1",
                          "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(reasoning_server):
    return openai_client(reasoning_server)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def _chat(client, model, choice: str, **extra):
    extra_body = {"guided_choice": [choice], **extra.pop("extra_body", {})}
    return client.chat.completions.create(model=model, messages=ASK, max_tokens=200,
                                          temperature=0, tools=TOOLS, extra_body=extra_body,
                                          **extra)


def test_reasoning_and_content_whole_and_streamed(client, model):
    whole = _chat(client, model, THOUGHT)
    message = whole.choices[0].message
    # the call written inside the reasoning is not a call
    assert message.reasoning_content == message.reasoning == f"Maybe I call {CALL} first."
    assert message.content == "It is noon." and not message.tool_calls
    assert whole.choices[0].finish_reason == "stop"
    assert whole.usage.completion_tokens_details.reasoning_tokens > 0
    stream = _chat(client, model, THOUGHT, stream=True, n=2,
                   stream_options={"include_usage": True})
    reasoning, content, order = {0: "", 1: ""}, {0: "", 1: ""}, {0: [], 1: []}
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            piece = getattr(delta, "reasoning_content", None)
            if piece:
                assert delta.reasoning == piece
                reasoning[choice.index] += piece
                order[choice.index].append("reasoning")
            if delta.content:
                content[choice.index] += delta.content
                order[choice.index].append("content")
    for i in (0, 1):
        assert (reasoning[i], content[i]) == (message.reasoning_content, message.content)
        assert order[i].index("content") > max(k for k, kind in enumerate(order[i])
                                               if kind == "reasoning")
    assert usage.completion_tokens_details.reasoning_tokens == \
        2 * whole.usage.completion_tokens_details.reasoning_tokens


def test_tool_call_after_the_reasoning(client, model):
    reply = _chat(client, model, f"<think>Use the tool.</think>{CALL}")
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.reasoning_content == "Use the tool."
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_time",
                                                                         {"tz": "UTC"})


def test_include_reasoning_false(client, model):
    reply = _chat(client, model, THOUGHT, logprobs=True,
                  extra_body={"include_reasoning": False})
    message = reply.choices[0].message
    assert message.content == "It is noon." and message.reasoning_content is None
    assert reply.choices[0].logprobs is None  # they would show the reasoning (vLLM's)


def test_free_reply_is_reasoning_on_chat_and_responses(client, model):
    """deepseek_r1: a reply without tags is the thinking the template opened, cut by
    max_tokens; the chat answer and the Responses reasoning item carry the same text."""
    chat = client.chat.completions.create(model=model, messages=ASK, max_tokens=6,
                                          temperature=0)
    text = chat.choices[0].message.reasoning_content
    assert text and chat.choices[0].message.content is None
    resp = client.responses.create(model=model, input=ASK[0]["content"], max_output_tokens=6,
                                   temperature=0)
    assert [item.type for item in resp.output] == ["reasoning", "message"]
    assert resp.output[0].content[0].text == text
    assert resp.usage.output_tokens_details.reasoning_tokens > 0
    with client.responses.stream(model=model, input=ASK[0]["content"], max_output_tokens=6,
                                 temperature=0) as stream:
        events = list(stream)
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == text
    final = events[-1].response
    assert [item.type for item in final.output] == ["reasoning", "message"]
    # the stored response continues with its reasoning as the assistant turn's
    follow = client.responses.create(model=model, input="And now?", max_output_tokens=2,
                                     previous_response_id=resp.id, temperature=0)
    assert follow.status in ("completed", "incomplete")


def test_responses_reasoning_field(client, model):
    resp = client.responses.create(model=model, input="Hi", max_output_tokens=2,
                                   reasoning={"effort": "low"})
    assert resp.reasoning.effort == "low"
    import openai

    with pytest.raises(openai.BadRequestError, match="summaries are not produced") as err:
        client.responses.create(model=model, input="Hi", max_output_tokens=2,
                                reasoning={"summary": "auto"})
    assert err.value.body["param"] == "reasoning.summary"


def test_responses_logprobs_leave_out_the_reasoning(client, model):
    """The output_text's logprobs are its own tokens': a reply that is all reasoning has an
    empty message and no logprobs, whole or streamed (vLLM streams none for reasoning)."""
    kwargs = dict(model=model, input=ASK[0]["content"], max_output_tokens=6, temperature=0,
                  include=["message.output_text.logprobs"], top_logprobs=2)
    resp = client.responses.create(**kwargs)
    assert [item.type for item in resp.output] == ["reasoning", "message"]
    assert resp.output_text == "" and resp.output[1].content[0].logprobs == []
    events = list(client.responses.create(stream=True, **kwargs))
    assert not [e for e in events if e.type == "response.output_text.delta" and e.logprobs]
    final = events[-1].response
    assert final.output[0].content[0].text == resp.output[0].content[0].text
    assert final.output[1].content[0].logprobs == []
