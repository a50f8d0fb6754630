"""Every bad request answers 4xx in OpenAI's error format, and the server keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest


def _post(server, path: str, **kwargs) -> httpx.Response:
    return httpx.post(server.base_url + path, timeout=30, **kwargs)


def _assert_openai_error(resp: httpx.Response, status: int, param: str | None = "") -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param != "":
        assert err["param"] == param
    return err


GOOD = {"prompt": "Hello", "max_tokens": 4}
BAD_COMPLETIONS = [
    ({**GOOD, "max_tokens": "4"}, "max_tokens"),
    ({**GOOD, "max_tokens": -1}, "max_tokens"),
    ({**GOOD, "max_tokens": 0}, "max_tokens"),
    ({**GOOD, "max_tokens": 10**9}, "max_tokens"),
    ({**GOOD, "max_tokens": 4.5}, "max_tokens"),
    ({**GOOD, "temperature": "hot"}, "temperature"),
    ({**GOOD, "temperature": -0.5}, "temperature"),
    ({**GOOD, "top_p": 0}, "top_p"),
    ({**GOOD, "logprobs": 50}, "logprobs"),
    ({**GOOD, "stream": "yes"}, "stream"),
    ({**GOOD, "n": 0}, "n"),
    ({**GOOD, "prompt": ""}, "prompt"),
    ({**GOOD, "prompt": []}, "prompt"),
    ({**GOOD, "prompt": ["a", ""]}, "prompt"),  # one empty prompt in a batch
    ({**GOOD, "prompt": 5}, None),
    ({**GOOD, "prompt": [1, 10**7]}, "prompt"),
    ({**GOOD, "stop": ""}, "stop"),
    ({**GOOD, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"max_tokens": 4}, "prompt"),
    ({**GOOD, "presence_penalty": 3.0}, "presence_penalty"),
    ({**GOOD, "prompt_logprobs": 21}, "prompt_logprobs"),
    ({**GOOD, "echo": True, "max_tokens": -1}, "max_tokens"),
    ({**GOOD, "use_beam_search": True}, "use_beam_search"),
    ({**GOOD, "logit_bias": {"x": 1}}, "logit_bias"),
    ({**GOOD, "guided_regex": "(unclosed"}, "guided_regex"),
]


@pytest.mark.parametrize("body,param", BAD_COMPLETIONS)
def test_bad_completion_bodies_are_400(tiny_server, body, param):
    err = _assert_openai_error(_post(tiny_server, "/v1/completions", json=body), 400)
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] is not None and err["param"].startswith(param)


@pytest.mark.parametrize("body", [
    {"messages": [], "max_tokens": 4},
    {"messages": "hi", "max_tokens": 4},
    {"messages": [{"role": "wizard", "content": "hi"}]},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
    {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2},
    {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -3},
    {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
])
def test_bad_chat_bodies_are_400(tiny_server, body):
    _assert_openai_error(_post(tiny_server, "/v1/chat/completions", json=body), 400)


def test_malformed_json_is_400(tiny_server):
    resp = _post(tiny_server, "/v1/completions", content=b'{"prompt": "hi", ',
                 headers={"content-type": "application/json"})
    err = _assert_openai_error(resp, 400)
    assert "JSON" in err["message"]


def test_non_json_body_is_400(tiny_server):
    _assert_openai_error(_post(tiny_server, "/v1/completions", content=b"hello",
                               headers={"content-type": "text/plain"}), 400)


def test_unknown_model_is_404(tiny_server):
    err = _assert_openai_error(_post(tiny_server, "/v1/completions",
                                     json={**GOOD, "model": "gpt-17"}), 404, "model")
    assert err["code"] == "model_not_found"


def test_prompt_longer_than_context_names_both_lengths(tiny_server):
    ids = [5] * 600  # the tiny model's context is 512
    err = _assert_openai_error(_post(tiny_server, "/v1/completions",
                                     json={"prompt": ids, "max_tokens": 1}), 400, "prompt")
    assert "512" in err["message"] and "600" in err["message"]
    assert err["code"] == "context_length_exceeded"


def test_prompt_plus_max_tokens_over_context(tiny_server):
    err = _assert_openai_error(_post(tiny_server, "/v1/completions",
                                     json={"prompt": [5] * 500, "max_tokens": 100}), 400,
                               "max_tokens")
    assert "500" in err["message"] and "512" in err["message"]


def test_unknown_route_and_method_in_openai_format(tiny_server):
    _assert_openai_error(httpx.get(tiny_server.base_url + "/v1/nothing"), 404)
    _assert_openai_error(httpx.get(tiny_server.base_url + "/v1/completions"), 405)


def test_openai_client_sees_typed_errors(client, model):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model, prompt="hi", max_tokens=-2)
    assert info.value.status_code == 400
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="not-this-one", prompt="hi", max_tokens=2)


def test_server_still_serves_after_bad_input(tiny_server):
    assert httpx.get(tiny_server.base_url + "/health").json() == {"status": "ok"}
    resp = _post(tiny_server, "/v1/completions", json={**GOOD, "temperature": 0})
    assert resp.status_code == 200
    assert resp.json()["usage"]["completion_tokens"] >= 1
