"""A vLLM user's requests against a real server on the tiny random Llama.

- Every field of OpenAI's and vLLM's completions and chat request schemas is honoured or
  answered with a 400 naming it (`test_every_schema_field_*` walks the lists).
- n, batched prompts, echo, penalties, logit_bias, stop_reason, structured outputs
  (response_format json_schema / json_object, guided_*), /tokenize, /detokenize, /version.
"""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import jsonschema
import openai
import pytest

PROMPT = "The quick brown fox jumps over the lazy dog."
MESSAGES = [{"role": "user", "content": "Say something."}]

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "age", "ok", "color"],
    "additionalProperties": False,
}

# field -> a value that is not the field's default. "ok": honoured (tests below and in
# tests/engine check what each does); "400": cadence lacks it and says so, naming the field.
COMMON_FIELDS = {
    "model": (None, "ok"),  # filled in with the served name
    "frequency_penalty": (0.5, "ok"), "presence_penalty": (0.5, "ok"),
    "logit_bias": ({"5": -100}, "ok"), "n": (2, "ok"), "seed": (3, "ok"),
    "stop": ("\n", "ok"), "stream": (False, "ok"), "temperature": (0.5, "ok"),
    "top_p": (0.9, "ok"), "user": ("u1", "ok"), "best_of": (2, "400"),
    "use_beam_search": (True, "400"), "top_k": (5, "ok"), "min_p": (0.1, "ok"),
    "repetition_penalty": (1.2, "ok"),
    "length_penalty": (0.5, "ok"),  # beam search only, in vLLM too (and beam search is a 400)
    "stop_token_ids": ([7], "ok"), "include_stop_str_in_output": (True, "ok"),
    "ignore_eos": (True, "ok"), "min_tokens": (1, "ok"),
    "skip_special_tokens": (False, "ok"), "spaces_between_special_tokens": (False, "ok"),
    "truncate_prompt_tokens": (8, "ok"), "truncation_side": ("right", "ok"),
    "allowed_token_ids": ([1, 2], "ok"),
    "prompt_logprobs": (1, "ok"), "add_special_tokens": (False, "ok"),
    "response_format": ({"type": "json_object"}, "ok"),
    "guided_json": (SCHEMA, "ok"), "guided_regex": ("[ab]{3}", "ok"),
    "guided_choice": (["yes", "no"], "ok"), "guided_grammar": ('start: "x" | "y"', "ok"),
    "guided_decoding_backend": ("xgrammar", "400"), "guided_whitespace_pattern": (" ", "400"),
    "structured_outputs": ({"choice": ["a", "b"]}, "ok"), "priority": (1, "ok"),
    "request_id": ("r1", "ok"), "logits_processors": (["x"], "400"),
    "return_tokens_as_token_ids": (True, "ok"), "return_token_ids": (True, "ok"),
    "cache_salt": ("salt", "ok"),
    # Honoured by disaggregated workers (tests/disagg); this colocated server refuses it.
    "kv_transfer_params": ({"do_remote_decode": True}, "400"),
    "vllm_xargs": ({"a": 1}, "400"), "bad_words": (["x"], "ok"),
    "stream_options": ({"include_usage": True}, "400"),  # only with stream=true
    # Newer vLLM fields: accepted where vLLM leaves them without effect here, refused where
    # they would change the output and cadence lacks the feature.
    "session_id": ("s1", "ok"), "include_reasoning": (False, "ok"),
    "routed_experts_prompt_start": (2, "ok"), "return_token_offsets": (True, "ok"),
    "return_mm_kwargs": (False, "ok"), "stream_interval": (4, "ok"),
    "watermarking": (True, "400"), "logprob_token_ids": ([5], "400"),
    "repetition_detection": ({"max_pattern_size": 4, "min_count": 3}, "400"),
    "thinking_token_budget": (10, "400"), "media_io_kwargs": ({"image": {}}, "400"),
    "ec_transfer_params": ({"x": 1}, "400"),
}
COMPLETION_FIELDS = {
    **COMMON_FIELDS, "prompt": ([PROMPT, "Hello"], "ok"), "echo": (True, "ok"),
    "logprobs": (2, "ok"), "max_tokens": (4, "ok"), "suffix": ("end", "400"),
    "prompt_embeds": ("abc", "400"),
    # chat template variables in vLLM's chat requests, not part of its completions
    "documents": ([{"text": "x"}], "400"), "reasoning_effort": ("low", "400"),
}
CHAT_FIELDS = {
    **COMMON_FIELDS, "messages": (MESSAGES, "ok"), "logprobs": (True, "ok"),
    "top_logprobs": (2, "400"),  # alone: needs logprobs=true
    "max_tokens": (4, "ok"), "max_completion_tokens": (4, "ok"), "metadata": ({"k": "v"}, "ok"),
    "store": (False, "ok"), "service_tier": ("auto", "ok"), "parallel_tool_calls": (True, "ok"),
    "audio": ({"voice": "x", "format": "wav"}, "400"), "function_call": ("auto", "400"),
    "functions": ([{"name": "f"}], "400"), "modalities": (["text", "audio"], "400"),
    "prediction": ({"type": "content", "content": "x"}, "400"),
    "reasoning_effort": ("low", "ok"), "tool_choice": ("required", "400"),
    "tools": ([{"type": "function", "function": {"name": "f"}}], "400"),
    "web_search_options": ({}, "400"), "verbosity": ("low", "400"),
    "safety_identifier": ("s", "ok"), "prompt_cache_key": ("k", "ok"),
    "echo": (True, "ok"), "add_generation_prompt": (False, "ok"),
    "continue_final_message": (True, "400"),  # needs add_generation_prompt=false
    "documents": ([{"text": "x"}], "ok"), "chat_template": ("{{ messages[0]['content'] }}", "ok"),
    "chat_template_kwargs": ({"x": 1}, "ok"), "mm_processor_kwargs": ({"x": 1}, "400"),
    "structural_tag": ("{}", "400"), "return_prompt_text": (True, "400"),
}


@pytest.fixture(scope="module")
def http(tiny_server):
    with httpx.Client(base_url=tiny_server.base_url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def model(http) -> str:
    return http.get("/v1/models").json()["data"][0]["id"]


def _walk(http, model, path, base, fields):
    wrong = []
    for name, (value, expected) in fields.items():
        body = {**base, "model": model}
        if name != "model":
            body[name] = value
        resp = http.post(path, json=body)
        got = "ok" if resp.status_code == 200 else str(resp.status_code)
        if got != expected:
            wrong.append((name, expected, got, resp.text[:200]))
        elif got == "400" and resp.json()["error"]["param"] != name:
            wrong.append((name, "param=" + name, resp.json()["error"]["param"], resp.text[:200]))
    assert not wrong, wrong


def test_every_schema_field_of_completions(http, model):
    _walk(http, model, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4},
          COMPLETION_FIELDS)


def test_every_schema_field_of_chat(http, model):
    _walk(http, model, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4},
          CHAT_FIELDS)


def test_n_batched_prompts_and_echo(http, model):
    greedy = {"model": model, "max_tokens": 5, "temperature": 0}
    single = [http.post("/v1/completions", json={**greedy, "prompt": p}).json()
              for p in (PROMPT, "Hello there")]
    batch = http.post("/v1/completions", json={**greedy, "prompt": [PROMPT, "Hello there"]}).json()
    assert [c["index"] for c in batch["choices"]] == [0, 1]
    assert [c["text"] for c in batch["choices"]] == [s["choices"][0]["text"] for s in single]
    assert batch["usage"]["prompt_tokens"] == sum(s["usage"]["prompt_tokens"] for s in single)
    # n=3 seeded: three different draws; the prompt counts once in usage.
    many = http.post("/v1/completions", json={
        "model": model, "prompt": PROMPT, "max_tokens": 6, "n": 3, "seed": 5}).json()
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    assert len({c["text"] for c in many["choices"]}) > 1
    assert many["usage"]["prompt_tokens"] == single[0]["usage"]["prompt_tokens"]
    echoed = http.post("/v1/completions", json={**greedy, "prompt": PROMPT, "echo": True}).json()
    assert echoed["choices"][0]["text"] == PROMPT + single[0]["choices"][0]["text"]


def test_n_streamed_carries_every_index(http, model):
    seen: dict[int, str] = {}
    finished = set()
    with http.stream("POST", "/v1/chat/completions", json={
            "model": model, "messages": MESSAGES, "max_tokens": 5, "n": 2, "seed": 1,
            "stream": True}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                seen[choice["index"]] = seen.get(choice["index"], "") + (
                    choice["delta"].get("content") or "")
                if choice["finish_reason"]:
                    finished.add(choice["index"])
    assert finished == {0, 1}


def test_stop_reason_and_include_stop_str(http, model):
    greedy = {"model": model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0,
              "ignore_eos": True}
    text = http.post("/v1/completions", json=greedy).json()["choices"][0]["text"]
    stop = next(text[i:i + 2] for i in range(1, len(text) - 2) if text[i:i + 2].strip())
    cut = http.post("/v1/completions", json={**greedy, "stop": stop}).json()["choices"][0]
    assert cut["text"] == text[:text.index(stop)]
    assert cut["finish_reason"] == "stop" and cut["stop_reason"] == stop
    kept = http.post("/v1/completions", json={**greedy, "stop": [stop],
                                               "include_stop_str_in_output": True}).json()
    assert kept["choices"][0]["text"] == text[:text.index(stop) + len(stop)]


def test_logit_bias_and_penalties_change_greedy_output(http, model, tiny_tokenizer):
    greedy = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
              "ignore_eos": True, "logprobs": 0}
    plain = http.post("/v1/completions", json=greedy).json()["choices"][0]
    first = tiny_tokenizer.encode(plain["logprobs"]["tokens"][0], add_special_tokens=False)[0]
    biased = http.post("/v1/completions", json={**greedy, "logit_bias": {str(first): -100}})
    assert biased.json()["choices"][0]["logprobs"]["tokens"][0] != plain["logprobs"]["tokens"][0]
    penalized = http.post("/v1/completions", json={
        **greedy, "frequency_penalty": 2.0, "presence_penalty": 2.0}).json()["choices"][0]
    tokens = penalized["logprobs"]["tokens"]
    assert len(set(tokens)) >= len(set(plain["logprobs"]["tokens"]))


def test_json_schema_responses_all_validate(http, model):
    """100 seeded requests, sampled at temperature 1 from a random model: the grammar alone
    makes every one parse and validate."""
    body = {"model": model, "messages": [{"role": "user", "content": "A person as JSON."}],
            "max_tokens": 96, "temperature": 1.0,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "person", "schema": SCHEMA}}}

    def one(seed: int) -> dict:
        resp = http.post("/v1/chat/completions", json={**body, "seed": seed})
        assert resp.status_code == 200, resp.text
        return resp.json()["choices"][0]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        choices = list(pool.map(one, range(100)))
    for choice in choices:
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)


def test_other_structured_outputs(http, model):
    def text(extra):
        resp = http.post("/v1/completions", json={"model": model, "prompt": PROMPT,
                                                  "max_tokens": 24, "seed": 0, **extra})
        assert resp.status_code == 200, resp.text
        return resp.json()["choices"][0]["text"]

    assert text({"guided_choice": ["alpha", "beta"]}) in ("alpha", "beta")
    import re
    assert re.fullmatch(r"[ab]{3}-\d", text({"guided_regex": r"[ab]{3}-\d"}))
    assert isinstance(json.loads(text({"response_format": {"type": "json_object"},
                                       "max_tokens": 64, "temperature": 0.2})), dict)
    assert text({"structured_outputs": {"choice": ["x", "y"]}}) in ("x", "y")
    bad = http.post("/v1/completions", json={"model": model, "prompt": PROMPT,
                                             "guided_regex": "(unclosed"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "guided_regex"


def test_tokenize_detokenize_version(http, model, tiny_tokenizer):
    tok = http.post("/tokenize", json={"model": model, "prompt": PROMPT}).json()
    assert tok["tokens"] == tiny_tokenizer.encode(PROMPT) and tok["count"] == len(tok["tokens"])
    chat = http.post("/tokenize", json={"messages": MESSAGES}).json()
    rendered = tiny_tokenizer.apply_chat_template(MESSAGES)
    assert chat["tokens"] == tiny_tokenizer.encode(rendered, add_special_tokens=False)
    back = http.post("/detokenize", json={"tokens": tok["tokens"]}).json()
    assert back["prompt"] == tiny_tokenizer.decode(tok["tokens"])
    assert http.post("/detokenize", json={"tokens": [10**9]}).status_code == 400
    assert http.post("/tokenize", json={}).status_code == 400
    assert http.get("/version").json()["version"]


def _panel_series(dashboard: dict) -> set[str]:
    """Every cadence series name the dashboard's panel queries read."""
    import re

    names = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            found = re.findall(r"cadence:[a-zA-Z0-9_:]+", target["expr"])
            assert found, (panel["title"], target["expr"])
            assert '{model_name="$model_name"}' in target["expr"], target["expr"]
            names.update(found)
    return names


def test_grafana_dashboard_queries_find_their_series(http, model, tiny_server):
    """docs/grafana/cadence.json: every panel's query has its series on a live /metrics,
    labelled with the served model_name (the dashboard's $model_name variable)."""
    import os

    from prometheus_client.parser import text_string_to_metric_families

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "grafana", "cadence.json"), encoding="utf-8") as f:
        dashboard = json.load(f)
    # Traffic that fills every series: concurrent streams (decode steps next to prefill).
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: http.post("/v1/completions", json={
            "model": model, "prompt": PROMPT * (1 + i), "max_tokens": 8}), range(4)))
    text = http.get("/metrics").text
    labelled: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labelled.setdefault(sample.name, set()).add(sample.labels.get("model_name"))
    variable = dashboard["templating"]["list"][-1]["query"]["query"]
    assert variable == "label_values(cadence:num_requests_running, model_name)"
    missing = {name for name in _panel_series(dashboard) if model not in labelled.get(name, ())}
    assert not missing, missing
    # Every cadence series carries the label, as vLLM's do.
    unlabelled = {n for n, models in labelled.items() if n.startswith("cadence:") and None in models}
    assert not unlabelled, unlabelled


def test_chat_template_kwargs_reach_the_template(http, model, tiny_tokenizer):
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 1,
            "chat_template": "{{ greeting }} {{ messages[0]['content'] }}",
            "chat_template_kwargs": {"greeting": "Hi"}}
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] == len(
        tiny_tokenizer.encode("Hi hello", add_special_tokens=False))
    bad = http.post("/v1/chat/completions", json={**body, "chat_template_kwargs": {"messages": []}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs", bad.text
    counted = http.post("/tokenize", json={"messages": body["messages"],
                                           "chat_template_kwargs": {"enable_thinking": False}})
    assert counted.status_code == 200, counted.text
    assert http.post("/tokenize", json={"messages": body["messages"],
                                        "chat_template_kwargs": {"range": 1}}).status_code == 400


def test_documents_and_reasoning_effort_reach_the_chat_template(client, http):
    """vLLM passes `documents` and `reasoning_effort` to the chat template (and sets
    enable_thinking from the effort unless chat_template_kwargs does)."""
    model = client.models.list().data[0].id
    template = ("{{ documents[0]['title'] }}|{{ reasoning_effort }}|{{ enable_thinking }}|"
                "{{ messages[0]['content'] }}")

    def rendered(**extra) -> str:
        out = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "q"}], max_tokens=1,
            extra_body={"chat_template": template, "return_token_ids": True, **extra})
        ids = out.model_dump()["prompt_token_ids"]
        return http.post("/detokenize", json={"model": model, "tokens": ids}).json()["prompt"]

    docs = [{"title": "Paged attention", "text": "blocks"}]
    assert rendered(documents=docs, reasoning_effort="low") == "Paged attention|low|True|q"
    assert rendered(documents=docs, reasoning_effort="none") == "Paged attention|none|False|q"
    assert rendered(documents=docs, reasoning_effort="high",
                    chat_template_kwargs={"enable_thinking": False}) == \
        "Paged attention|high|False|q"
    with pytest.raises(openai.BadRequestError, match="reasoning_effort"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "q"}],
                                       max_tokens=1, extra_body={"reasoning_effort": "extreme"})


def test_request_id_names_the_response_as_in_vllm(client):
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "hi"}]
    # Two at once with one id: the engine's own ids keep them apart.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        chats = list(pool.map(lambda _: client.chat.completions.create(
            model=model, messages=messages, max_tokens=2, extra_body={"request_id": "r-1"}),
            range(2)))
    assert [c.id for c in chats] == ["chatcmpl-r-1", "chatcmpl-r-1"]
    done = client.completions.create(model=model, prompt="hi", max_tokens=2,
                                     extra_body={"request_id": "r-2"})
    assert done.id == "cmpl-r-2"
    stream = client.completions.create(model=model, prompt="hi", max_tokens=3, stream=True,
                                       extra_body={"request_id": "r-2"},
                                       extra_headers={"X-Request-Id": "from-header"})
    assert {c.id for c in stream} == {"cmpl-from-header"}
    assert client.completions.create(model=model, prompt="hi", max_tokens=1).id != "cmpl-r-2"


def test_retrieve_model_answers_each_listed_name_and_404s_others(client, http, model):
    """OpenAI's GET /v1/models/{id}: the listed card for a served name (the official client's
    models.retrieve parses it), an OpenAI-format 404 naming the model for any other id,
    slashes in ids included."""
    listed = http.get("/v1/models").json()["data"]
    for card in listed:
        got = http.get(f"/v1/models/{card['id']}")
        assert got.status_code == 200 and got.json() == card
    retrieved = client.models.retrieve(model)
    assert retrieved.id == model and retrieved.object == "model"
    for unknown in ("no-such-model", "org/no-such-model", model + "x"):
        resp = http.get(f"/v1/models/{unknown}")
        assert resp.status_code == 404, resp.text
        error = resp.json()["error"]
        assert error["code"] == "model_not_found" and unknown in error["message"]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("org/no-such-model")


def test_ping_answers_as_health(http):
    for method in ("GET", "POST"):
        resp = http.request(method, "/ping")
        assert resp.status_code == 200 and resp.json() == {"status": "ok"}


def test_invocations_dispatch_chat_and_completions_as_their_routes(client, http):
    """vLLM's POST /invocations (SageMaker): a body with messages is a chat completion, any
    other a completion; the answers equal the routes' own, errors included."""
    model = client.models.list().data[0].id
    greedy = {"model": model, "max_tokens": 4, "temperature": 0}
    chat = {**greedy, "messages": [{"role": "user", "content": "hi"}]}
    done = {**greedy, "prompt": "The quick brown fox"}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", done)):
        want, got = http.post(path, json=body).json(), http.post("/invocations", json=body).json()
        assert got["object"] == want["object"] and got["choices"] == want["choices"]
    bad = http.post("/invocations", json={**done, "max_tokens": "4"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    assert http.post("/invocations", content=b"{").status_code == 400


def test_tokenize_takes_vllms_chat_fields_and_counts_as_the_chat_runs(client, http,
                                                                       tiny_tokenizer):
    """vLLM's /tokenize fields: chat_template, continue_final_message, tools (the template
    sees them as a chat completion passes them) and return_token_strs; each chat counts the
    tokens its completion runs."""
    model = client.models.list().data[0].id
    template = ("{% if tools %}{{ tools[0]['function']['name'] }}|{% endif %}"
                "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                "{% if add_generation_prompt %}<assistant>{% endif %}")
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    opened = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, "}]
    variables = ("{% for d in documents or [] %}[{{ d['title'] }}:{{ d['text'] }}]{% endfor %}"
                 "{{ reasoning_effort or '' }}{{ 'T' if enable_thinking else 'F' }}") + template
    documents = [{"title": "a", "text": "alpha beta"}, {"title": "b", "text": "gamma"}]
    for fields in ({"chat_template": template},
                   {"chat_template": template, "tools": tools},
                   {"continue_final_message": True, "add_generation_prompt": False},
                   {"chat_template": variables, "documents": documents},
                   {"chat_template": variables, "reasoning_effort": "low"},
                   {"chat_template": variables, "reasoning_effort": "none",
                    "chat_template_kwargs": {"enable_thinking": True}}):
        messages = opened if fields.get("continue_final_message") else opened[:1]
        chat_fields = {**fields, "tool_choice": "none"} if "tools" in fields else fields
        ran = client.chat.completions.create(
            model=model, messages=messages, max_tokens=1,
            extra_body={"return_token_ids": True, **chat_fields}).model_dump()
        counted = http.post("/tokenize", json={"model": model, "messages": messages, **fields})
        assert counted.status_code == 200, counted.text
        assert counted.json()["tokens"] == ran["prompt_token_ids"], fields
    with_strs = http.post("/tokenize", json={"model": model, "prompt": "Hello world",
                                             "return_token_strs": True}).json()
    assert with_strs["token_strs"] == [tiny_tokenizer.backend.id_to_token(t)
                                       for t in with_strs["tokens"]]
    bad = http.post("/tokenize", json={"model": model, "prompt": "hi", "chat_template": "x"})
    assert bad.status_code == 400
    for extra in ({"documents": documents}, {"reasoning_effort": "low"}):  # chat-only variables
        bad = http.post("/tokenize", json={"model": model, "prompt": "hi", **extra})
        assert bad.status_code == 400, extra
    bad = http.post("/tokenize", json={"model": model, "messages": opened[:1],
                                       "reasoning_effort": "loud"})
    assert bad.status_code == 400 and "reasoning_effort" in bad.text
