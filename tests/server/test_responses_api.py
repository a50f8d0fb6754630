"""POST /v1/responses (OpenAI's Responses API) over HTTP with the official openai client, on
the tiny random Llama: greedy output equal to /v1/chat/completions' for the same messages,
the streamed event sequence, structured output, named function calls, stored responses and
previous_response_id, and hostile bodies answered 400 in OpenAI's error format.
"""

from __future__ import annotations

import json
import time

import httpx
import jsonschema
import openai
import pytest

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6},
                   "ok": {"type": "boolean"},
                   "color": {"enum": ["red", "green", "blue"]}},
    "required": ["name", "ok", "color"],
    "additionalProperties": False,
}
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather of a city.",
                "parameters": {"type": "object",
                               "properties": {"city": {"type": "string", "maxLength": 8}},
                               "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def http(tiny_server):
    with httpx.Client(base_url=tiny_server.base_url, timeout=120) as c:
        yield c


def _chat_text(client, model, messages, max_tokens, **extra):
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                          temperature=0, **extra)
    return chat.choices[0], chat.usage


def test_text_input_matches_chat(client, model):
    resp = client.responses.create(model=model, instructions="Be brief.", input="Say hello.",
                                   max_output_tokens=12, temperature=0)
    choice, usage = _chat_text(client, model, [{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "Say hello."}], 12)
    assert resp.id.startswith("resp_") and resp.object == "response"
    assert resp.model == model and resp.instructions == "Be brief."
    assert len(resp.output) == 1 and resp.output[0].type == "message"
    assert resp.output[0].role == "assistant"
    assert resp.output[0].content[0].type == "output_text"
    assert resp.output_text == choice.message.content
    assert resp.usage.input_tokens == usage.prompt_tokens
    assert resp.usage.output_tokens == usage.completion_tokens
    assert resp.usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert resp.usage.output_tokens_details.reasoning_tokens == 0
    if choice.finish_reason == "length":
        assert resp.status == "incomplete"
        assert resp.incomplete_details.reason == "max_output_tokens"
    else:
        assert resp.status == "completed" and resp.incomplete_details is None


def test_cut_by_max_output_tokens_is_incomplete(client, model):
    resp = client.responses.create(model=model, input="Count to a hundred.",
                                   max_output_tokens=3, temperature=0,
                                   extra_body={"ignore_eos": True})
    assert resp.status == "incomplete"
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.output_tokens == 3
    assert resp.output[0].status == "incomplete"


def test_message_items_and_parts_match_chat(client, model):
    items = [
        {"role": "system", "content": "You are terse."},
        {"role": "developer", "content": [{"type": "input_text", "text": "Answer"},
                                          {"type": "input_text", "text": "in English."}]},
        {"role": "user", "content": "Hi."},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Hello."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "What now?"}]},
    ]
    resp = client.responses.create(model=model, input=items, max_output_tokens=10,
                                   temperature=0)
    chat_messages = [{"role": "system", "content": "You are terse."},
                     {"role": "developer", "content": "Answer\nin English."},  # parts: "\n"-joined
                     {"role": "user", "content": "Hi."},
                     {"role": "assistant", "content": "Hello."},
                     {"role": "user", "content": "What now?"}]
    choice, usage = _chat_text(client, model, chat_messages, 10)
    assert resp.output_text == choice.message.content
    assert resp.usage.input_tokens == usage.prompt_tokens


def test_stream_events_in_order(client, model):
    whole = client.responses.create(model=model, input="Tell a story.", max_output_tokens=16,
                                    temperature=0)
    events = list(client.responses.create(model=model, input="Tell a story.",
                                          max_output_tokens=16, temperature=0, stream=True))
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert kinds == (["response.created", "response.in_progress",
                      "response.output_item.added", "response.content_part.added"]
                     + ["response.output_text.delta"] * len(deltas)
                     + ["response.output_text.done", "response.content_part.done",
                        "response.output_item.done", "response.completed"])
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(d.delta for d in deltas)
    assert text == whole.output_text
    item_id = events[2].item.id
    assert all(d.item_id == item_id and d.output_index == 0 for d in deltas)
    assert events[-4].text == text and events[-2].item.content[0].text == text
    done = events[-1].response
    assert done.status == whole.status and done.output_text == text
    assert done.id == events[0].response.id and done.id.startswith("resp_")
    assert done.usage.output_tokens == whole.usage.output_tokens
    assert done.usage.input_tokens == whole.usage.input_tokens


def test_sdk_stream_helper(client, model):
    with client.responses.stream(model=model, input="Say hi.", max_output_tokens=8,
                                 temperature=0) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.output_text == "".join(texts)
    assert final.usage.output_tokens >= 1


def test_json_schema_format_matches_chat(client, model):
    text = {"format": {"type": "json_schema", "name": "person", "schema": SCHEMA,
                       "strict": True}}
    resp = client.responses.create(model=model, input="A person as JSON.", text=text,
                                   max_output_tokens=96, temperature=0)
    jsonschema.validate(json.loads(resp.output_text), SCHEMA)
    choice, _ = _chat_text(client, model, [{"role": "user", "content": "A person as JSON."}],
                           96, response_format={"type": "json_schema", "json_schema": {
                               "name": "person", "schema": SCHEMA}})
    assert resp.output_text == choice.message.content
    assert resp.text.format.type == "json_schema"


def test_json_object_format(client, model):
    resp = client.responses.create(model=model, input="Some JSON.", max_output_tokens=64,
                                   temperature=0, text={"format": {"type": "json_object"}})
    choice, _ = _chat_text(client, model, [{"role": "user", "content": "Some JSON."}], 64,
                           response_format={"type": "json_object"})
    assert resp.output_text == choice.message.content
    if resp.status == "completed":
        assert isinstance(json.loads(resp.output_text), dict)


def test_named_function_call(client, model):
    choice = {"type": "function", "name": "get_weather"}
    resp = client.responses.create(model=model, input="Weather in Paris?", tools=[WEATHER_TOOL],
                                   tool_choice=choice, max_output_tokens=64, temperature=0)
    assert resp.status == "completed"
    calls = [item for item in resp.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert calls[0].call_id.startswith("call_") and calls[0].id.startswith("fc_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER_TOOL["parameters"])
    # Streamed: one function_call item whose argument deltas make the same arguments.
    events = list(client.responses.create(model=model, input="Weather in Paris?",
                                          tools=[WEATHER_TOOL], tool_choice=choice,
                                          max_output_tokens=64, temperature=0, stream=True))
    added = [e for e in events if e.type == "response.output_item.added"]
    assert len(added) == 1 and added[0].item.type == "function_call"
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert args == calls[0].arguments
    assert events[-1].type == "response.completed"
    assert events[-1].response.output[0].arguments == args
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # The call's output goes back in as items; the reply is the chat route's for the same turns.
    follow = [{"role": "user", "content": "Weather in Paris?"},
              {"type": "function_call", "call_id": "call_1", "name": "get_weather",
               "arguments": calls[0].arguments},
              {"type": "function_call_output", "call_id": "call_1", "output": "Sunny."}]
    again = client.responses.create(model=model, input=follow, max_output_tokens=8,
                                    temperature=0)
    chat, _ = _chat_text(client, model, [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": calls[0].arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny."}], 8)
    assert again.output_text == chat.message.content


LOGPROBS = ["message.output_text.logprobs"]


def _chat_logprobs(client, model, text, max_tokens, top):
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=max_tokens,
        temperature=0, logprobs=True, top_logprobs=top)
    return chat.choices[0]


def test_output_text_logprobs_match_chat(client, model):
    resp = client.responses.create(model=model, input="Tell a story.", max_output_tokens=12,
                                   temperature=0, include=LOGPROBS, top_logprobs=3)
    choice = _chat_logprobs(client, model, "Tell a story.", 12, 3)
    part = resp.output[0].content[0]
    assert part.text == choice.message.content
    assert "".join(e.token for e in part.logprobs) == part.text
    assert resp.top_logprobs == 3
    chat_entries = choice.logprobs.content
    if choice.finish_reason == "stop":  # the EOS token's entry: its text is not output text
        chat_entries = chat_entries[:-1]
    assert [e.token for e in part.logprobs] == [e.token for e in chat_entries]
    for mine, theirs in zip(part.logprobs, chat_entries):
        assert mine.logprob == pytest.approx(theirs.logprob, abs=1e-5)
        assert mine.bytes == list(mine.token.encode())
        assert len(mine.top_logprobs) == 3
        assert [t.token for t in mine.top_logprobs] == [t.token for t in theirs.top_logprobs]
        assert [t.logprob for t in mine.top_logprobs] == pytest.approx(
            [t.logprob for t in theirs.top_logprobs], abs=1e-5)
        # greedy: the sampled token is the likeliest
        assert mine.logprob == pytest.approx(mine.top_logprobs[0].logprob, abs=1e-5)


def test_output_text_logprobs_streamed(client, model):
    whole = client.responses.create(model=model, input="Tell a story.", max_output_tokens=12,
                                    temperature=0, include=LOGPROBS, top_logprobs=2)
    events = list(client.responses.create(model=model, input="Tell a story.",
                                          max_output_tokens=12, temperature=0, stream=True,
                                          include=LOGPROBS, top_logprobs=2))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    streamed = [lp for d in deltas for lp in d.logprobs]
    expected = whole.output[0].content[0].logprobs
    assert "".join(d.delta for d in deltas) == whole.output_text
    assert [e.token for e in streamed] == [e.token for e in expected]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in expected])
    assert all(len(e.top_logprobs) == 2 for e in streamed)
    done = next(e for e in events if e.type == "response.output_text.done")
    assert [e.token for e in done.logprobs] == [e.token for e in expected]
    final = events[-1].response.output[0].content[0]
    assert [e.token for e in final.logprobs] == [e.token for e in expected]


def test_logprobs_need_the_include(client, model):
    """top_logprobs alone computes none (vLLM's); include alone lists tokens without
    alternatives; reasoning.encrypted_content is accepted (nothing is encrypted)."""
    plain = client.responses.create(model=model, input="Hi", max_output_tokens=4,
                                    temperature=0, top_logprobs=5)
    assert plain.output[0].content[0].logprobs == [] and plain.top_logprobs is None
    bare = client.responses.create(model=model, input="Hi", max_output_tokens=4,
                                   temperature=0, include=LOGPROBS + [
                                       "reasoning.encrypted_content"])
    entries = bare.output[0].content[0].logprobs
    assert "".join(e.token for e in entries) == bare.output_text
    assert entries and all(e.top_logprobs == [] for e in entries)
    events = list(client.responses.create(model=model, input="Hi", max_output_tokens=4,
                                          temperature=0, stream=True, top_logprobs=5))
    assert all(e.logprobs == [] for e in events if e.type == "response.output_text.delta")


def test_previous_response_id_continues_the_conversation(client, model, http):
    first = client.responses.create(model=model, input="Name a color.", max_output_tokens=6,
                                    temperature=0)
    second = client.responses.create(model=model, input="Another one?", max_output_tokens=6,
                                     temperature=0, previous_response_id=first.id)
    assert second.previous_response_id == first.id
    choice, usage = _chat_text(client, model, [
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Another one?"}], 6)
    assert second.output_text == choice.message.content
    assert second.usage.input_tokens == usage.prompt_tokens
    got = http.get(f"/v1/responses/{first.id}")
    assert got.status_code == 200 and got.json()["id"] == first.id
    assert got.json()["output"][0]["content"][0]["text"] == first.output_text
    # A streamed response is stored too.
    events = list(client.responses.create(model=model, input="Hi.", max_output_tokens=4,
                                          temperature=0, stream=True))
    streamed_id = events[-1].response.id
    assert http.get(f"/v1/responses/{streamed_id}").status_code == 200
    # store=false keeps nothing: a follow-up is a 404 naming previous_response_id.
    unstored = client.responses.create(model=model, input="Hi.", max_output_tokens=4,
                                       store=False)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model=model, input="More.", previous_response_id=unstored.id)
    assert err.value.body["param"] == "previous_response_id"
    assert http.get(f"/v1/responses/{unstored.id}").status_code == 404


HOSTILE = [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": 5}, "input"),
    ({"input": None}, "input"),
    ({}, "input"),
    ({"input": [{"role": "wizard", "content": "hi"}]}, "input.0.role"),
    ({"input": ["hi"]}, "input"),
    ({"input": [{"role": "user", "content": 7}]}, "input.0.content"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input.0.content.0.type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
     "input.0.content.0.text"),
    ({"input": [{"type": "image_generation_call"}]}, "input.0.type"),
    ({"input": [{"type": "reasoning", "content": "x"}, {"role": "user", "content": "hi"}]},
     "input.0.content"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input.0.call_id"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"input": "hi", "tool_choice": {"type": "web_search"}}, "tool_choice"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "reasoning": {"effort": "huge"}}, "reasoning.effort"),
    ({"input": "hi", "reasoning": {"summary": "auto"}}, "reasoning.summary"),
    ({"input": "hi", "include": ["file_search_call.results"]}, "include"),
    ({"input": "hi", "include": ["message.input_image.image_url"]}, "include"),
    ({"input": "hi", "include": ["web_search_call.action.sources"]}, "include"),
    ({"input": "hi", "include": ["code_interpreter_call.outputs"]}, "include"),
    ({"input": "hi", "include": ["everything"]}, "include"),
    ({"input": "hi", "include": "message.output_text.logprobs"}, "include"),
    ({"input": "hi", "include": [7]}, "include"),
    ({"input": "hi", "top_logprobs": 21}, "top_logprobs"),
    ({"input": "hi", "top_logprobs": -1}, "top_logprobs"),
    ({"input": "hi", "top_logprobs": "3"}, "top_logprobs"),
    ({"input": "hi", "truncation": "auto"}, "truncation"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "max_output_tokens": 10 ** 9}, "max_output_tokens"),
    ({"input": "hi", "temperature": "1"}, "temperature"),
    ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
     "text.format.schema"),
    ({"input": "hi", "previous_response_id": "resp_nope"}, "previous_response_id"),
    ({"input": "hi", "model": "not-served"}, "model"),
    ({"input": "hi", "stream": True, "background": True}, "background"),
    ({"input": "\ud800"}, "input"),
    # "auto" tool choice needs the server's --tool-call-parser (as on the chat route).
    ({"input": "hi", "tools": [WEATHER_TOOL]}, "tools"),
    ({"input": "hi", "tools": [WEATHER_TOOL], "tool_choice": {"type": "function",
                                                             "name": "nope"}}, "tool_choice"),
    ({"input": "hi", "tools": [{"type": "function"}]}, "tools.0.name"),
]


@pytest.mark.parametrize("body,param", HOSTILE)
def test_hostile_bodies_are_openai_errors(http, model, body, param):
    body = {"model": model, **body} if "model" not in body else body
    # json.dumps escapes a lone surrogate as \\ud800 (valid JSON; httpx's json= cannot send it)
    resp = http.post("/v1/responses", content=json.dumps(body),
                     headers={"Content-Type": "application/json"})
    assert resp.status_code in (400, 404), resp.text
    error = resp.json()["error"]
    # (a union's member may follow the field's name, as on the chat route: "input.str")
    assert error["param"] == param or error["param"].startswith(param + "."), error
    assert error["type"] in ("invalid_request_error", "not_found_error")
    assert error["message"]


def test_bad_request_through_the_sdk(client, model):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=model, input="hi",
                                tools=[{"type": "web_search_preview"}])
    assert err.value.body["param"] == "tools.0.type"


def test_stream_disconnect_frees_the_request(tiny_server, client, model):
    stream = client.responses.create(model=model, input="Go on forever.", max_output_tokens=400,
                                     temperature=0, stream=True, extra_body={"ignore_eos": True})
    for event in stream:
        if event.type == "response.output_text.delta":
            break
    stream.close()  # the client goes away mid-reply
    # Generous: the abort lands within a step or two; this bounds a hang, not the speed.
    deadline = time.monotonic() + 60
    while True:
        m = tiny_server.metrics()
        if m["cadence:num_requests_running"] == 0 and m["cadence:kv_cache_blocks_used"] == 0:
            break
        assert time.monotonic() < deadline, f"the disconnected request kept running: {m}"
        time.sleep(0.1)


def test_concurrent_streams_match_their_whole_replies(tiny_server, client, model):
    """Eight streams at once (the engine batches them): each one's deltas and usage equal the
    same request's unstreamed reply."""
    import asyncio

    prompts = [f"Story number {i}." for i in range(8)]
    wholes = [client.responses.create(model=model, input=p, max_output_tokens=12,
                                      temperature=0) for p in prompts]

    async def one(aclient, prompt):
        stream = await aclient.responses.create(model=model, input=prompt, max_output_tokens=12,
                                                temperature=0, stream=True)
        events = [e async for e in stream]
        return events

    async def main():
        aclient = openai.AsyncOpenAI(base_url=tiny_server.v1, api_key="x", max_retries=0,
                                     timeout=120)
        try:
            return await asyncio.gather(*(one(aclient, p) for p in prompts))
        finally:
            await aclient.close()

    for whole, events in zip(wholes, asyncio.run(main())):
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text == whole.output_text
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[-1].type == "response.completed"
        assert events[-1].response.usage.output_tokens == whole.usage.output_tokens


def test_store_is_bounded_oldest_first():
    from cadence.server.responses_store import ResponseStore

    store = ResponseStore(max_responses=3, max_chars=200)
    for i in range(5):
        store.put(f"resp_{i}", [{"role": "user", "content": "x"}], {"id": f"resp_{i}"})
    assert len(store) == 3 and store.get("resp_0") is None and store.get("resp_4") is not None
    store.put("big", [{"role": "user", "content": "y" * 150}], {"id": "big"})
    assert store.get("big") is not None and store.get("resp_2") is None  # evicted for room
    store.put("huge", [{"role": "user", "content": "z" * 500}], {"id": "huge"})
    assert store.get("huge") is None and store.get("big") is not None  # never fits: not kept
