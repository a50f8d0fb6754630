"""Hostile input, round three, on the fake engine (fast, no model): request fields whose shape
or type the protocol layer let through (a 500, or a wrong type silently taken), and requests
whose bytes never finish arriving (a connection held forever). Each is a 4xx in OpenAI's
format, and the server keeps serving."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

import httpx
import pytest

from server_harness import fake_engine_args, openai_error as _error, start_server

# The header-block and body deadline, short so the slow-client tests take seconds.
READ_TIMEOUT_S = 1.5
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"prompt": "hi", "max_tokens": 2}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(str(tmp_path_factory.mktemp("fields")),
                       *fake_engine_args(max_model_len=512),
                       env={"CADENCE_REQUEST_READ_TIMEOUT_S": str(READ_TIMEOUT_S)})
    yield srv
    srv.stop()


def _served(server) -> None:
    resp = httpx.post(server.base_url + "/v1/completions", json=COMPLETION, timeout=30)
    assert resp.status_code == 200, resp.text


# ---- response_format's shape (a 500 on chat before: its grammar was derived first) -------------

@pytest.mark.parametrize("path,base", [("/v1/chat/completions", CHAT),
                                       ("/v1/completions", COMPLETION)])
@pytest.mark.parametrize("rf", [
    {"type": "json_schema"}, {"type": "json_schema", "json_schema": None},
    {"type": "json_schema", "json_schema": []},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": "not an object"}},
], ids=["missing", "null", "list", "schema-string"])
def test_malformed_json_schema_is_400_naming_response_format(server, path, base, rf):
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        err = _error(client.post(path, json={**base, "response_format": rf}), 400)
        assert err["param"] == "response_format" and err["code"] == "invalid_value", err
        assert "Internal" not in err["message"]
        # The same keep-alive connection goes on (a 500 used to close it under the client).
        assert client.post("/v1/completions", json=COMPLETION).status_code == 200


# ---- metadata fields are typed as OpenAI / vLLM type them --------------------------------------

@pytest.mark.parametrize("field,value", [
    ("user", []), ("user", 5), ("metadata", "x"), ("metadata", {"k": 1}), ("store", "yes"),
    ("service_tier", "fastest"), ("parallel_tool_calls", 1), ("length_penalty", "1"),
    ("include_reasoning", "x"), ("safety_identifier", {}), ("prompt_cache_key", 3),
])
def test_metadata_fields_of_the_wrong_type_are_400(server, field, value):
    for path, base in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
        resp = httpx.post(server.base_url + path, json={**base, field: value}, timeout=30)
        err = _error(resp, 400)
        assert err["param"].split(".")[0] == field and err["code"] == "invalid_value", err


def test_metadata_fields_of_the_right_type_are_accepted(server):
    fields = {"user": "u1", "metadata": {"k": "v"}, "store": False, "service_tier": "auto",
              "parallel_tool_calls": False, "length_penalty": 1.0, "include_reasoning": False,
              "safety_identifier": "s", "prompt_cache_key": "p", "session_id": "x",
              "return_token_offsets": True, "some_client_field": [1, {"a": None}]}
    for path, base in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
        resp = httpx.post(server.base_url + path, json={**base, **fields}, timeout=30)
        assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("path,base,field,value", [
    # Python's True == 1 and 0 == False made these pass as the neutral 1 / False.
    ("/v1/completions", COMPLETION, "best_of", True),
    ("/v1/chat/completions", CHAT, "use_beam_search", 0),
    ("/v1/completions", COMPLETION, "thinking_token_budget", -1.0),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 2}, "background", 0),
])
def test_unsupported_fields_take_only_their_neutral_values_exactly(server, path, base, field,
                                                                   value):
    err = _error(httpx.post(server.base_url + path, json={**base, field: value}, timeout=30),
                 400)
    assert err["param"] == field and err["code"] == "unsupported_parameter", err


@pytest.mark.parametrize("tools", [
    [{}], [{"type": "function"}], [{"type": "function", "function": {"name": 5}}],
    [{"type": "function", "function": {"name": "f", "parameters": 5}}],
], ids=["empty", "no-function", "name-not-string", "parameters-not-object"])
def test_malformed_tools_are_400_whatever_tool_choice_says(server, tools):
    """They reach the chat template with "none" too; only "required" / a named function
    checked them before. (Well-formed tools are served in test_tool_streaming.py: the fake
    engine renders no tools.)"""
    for choice in ("none", "required"):
        resp = httpx.post(server.base_url + "/v1/chat/completions", timeout=30,
                          json={**CHAT, "tools": tools, "tool_choice": choice})
        err = _error(resp, 400)
        assert err["param"] == "tools" and err["code"] == "invalid_value", err
    # /tokenize counts a chat as its completion renders it: the same tools, the same 400.
    resp = httpx.post(server.base_url + "/tokenize", timeout=30,
                      json={"messages": CHAT["messages"], "tools": tools})
    assert _error(resp, 400)["param"] == "tools"


@pytest.mark.parametrize("seed,status", [(2**63 - 1, 200), (-(2**63), 200), (2**63, 400),
                                         (2**64, 400), (-(2**63) - 1, 400)])
def test_seed_is_a_64_bit_integer_as_in_vllm(server, seed, status):
    for path, base in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION),
                       ("/v1/responses", {"input": "hi", "max_output_tokens": 2})):
        resp = httpx.post(server.base_url + path, json={**base, "seed": seed}, timeout=30)
        if status == 200:
            assert resp.status_code == 200, resp.text
        else:
            assert _error(resp, 400)["param"] == "seed"


# ---- Content-Type ------------------------------------------------------------------------------

def test_json_without_a_content_type_is_read_as_json(server):
    """As vLLM's servers read it (FastAPI >= 0.132 refuses it by default)."""
    resp = httpx.post(server.base_url + "/v1/completions", content=json.dumps(COMPLETION),
                      headers={"content-type": ""}, timeout=30)
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_body_declared_as_something_else_is_400_saying_what_to_send(server, ctype):
    resp = httpx.post(server.base_url + "/v1/completions", content=json.dumps(COMPLETION),
                      headers={"content-type": ctype}, timeout=30)
    err = _error(resp, 400)
    assert err["code"] == "invalid_content_type" and "application/json" in err["message"]


# ---- bytes that never finish arriving ----------------------------------------------------------

def _socket(server) -> socket.socket:
    url = urlparse(server.base_url)
    sock = socket.create_connection((url.hostname, url.port), timeout=READ_TIMEOUT_S + 20)
    return sock


def _read_reply(sock: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def _assert_408_at_the_deadline(server, *parts: bytes) -> None:
    """Send `parts` a third of the deadline apart (later bytes must not extend it), never
    finishing the request: a 408 in OpenAI's format comes at the deadline."""
    with _socket(server) as sock:
        start = time.monotonic()
        for i, part in enumerate(parts):
            if i:
                time.sleep(READ_TIMEOUT_S / 3)
            sock.sendall(part)
        reply = _read_reply(sock)
        elapsed = time.monotonic() - start
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), reply[:300]
    assert b"connection: close" in head.lower()
    err = json.loads(body)["error"]
    assert err["code"] == "request_timeout" and err["type"] == "invalid_request_error"
    # Answered at the deadline, not when the client gives up (20 s later).
    assert READ_TIMEOUT_S * 0.9 < elapsed < READ_TIMEOUT_S + 5, elapsed
    _served(server)


def test_a_body_shorter_than_its_content_length_is_408(server):
    """A Content-Length that lies (more than is sent): uvicorn waited for the rest forever."""
    body = json.dumps(COMPLETION).encode()
    _assert_408_at_the_deadline(
        server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
        b"\r\nContent-Length: %d\r\n\r\n" % (len(body) + 50) + body, b" ")


def test_a_header_block_that_never_ends_is_408(server):
    _assert_408_at_the_deadline(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
                                b"X-Slow: 1\r\n", b"X-Slower: 1\r\n")


def test_a_connection_that_sends_nothing_is_closed(server):
    with _socket(server) as sock:
        start = time.monotonic()
        assert _read_reply(sock) == b""
        assert time.monotonic() - start < READ_TIMEOUT_S + 5


def test_keep_alive_requests_are_not_cut_by_the_deadline(server):
    """The deadline covers one header block: a connection serving requests back to back for
    longer than it is left alone."""
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        start = time.monotonic()
        while time.monotonic() - start < READ_TIMEOUT_S * 2:
            assert client.post("/v1/completions", json=COMPLETION).status_code == 200
            time.sleep(0.2)


# ---- chat echo of a final assistant message given as content parts -----------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_echo_repeats_an_assistant_message_given_as_text_parts(server, stream):
    parts = [{"type": "text", "text": "Sure,"}, {"type": "text", "text": "here"}]
    body = {"messages": [CHAT["messages"][0], {"role": "assistant", "content": parts}],
            "max_tokens": 2, "echo": True, "stream": stream}
    resp = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 200, resp.text
    if stream:
        first = json.loads(resp.text.split("data: ", 2)[1])
        text = first["choices"][0]["delta"]["content"]
    else:
        text = resp.json()["choices"][0]["message"]["content"]
    assert text.startswith("Sure,\nhere"), text  # it echoed nothing before (parts: "\n"-joined)


def test_tokenize_reads_content_parts_as_chat_does(server):
    """/tokenize counts a message of text parts as chat renders it (newline-joined, as vLLM),
    and refuses a non-text part with chat's 400 instead of dropping it."""
    def count(content):
        body = {"messages": [{"role": "user", "content": content}]}
        resp = httpx.post(server.base_url + "/tokenize", json=body, timeout=30)
        return resp.status_code, resp.json()

    status, joined = count("Hello\nthere")
    assert status == 200
    status, parts = count([{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}])
    assert status == 200 and parts["tokens"] == joined["tokens"]
    status, err = count([{"type": "text", "text": "Hi"},
                         {"type": "image_url", "image_url": {"url": "http://x/y.png"}}])
    assert status == 400 and err["error"]["param"] == "messages.0.content", err


@pytest.mark.parametrize("extra, messages", [
    ({}, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Sure"}]),
    ({"add_generation_prompt": False}, [{"role": "user", "content": "Hi"}]),
])
def test_tokenize_continue_final_message_is_checked_as_chat_checks_it(server, extra, messages):
    """continue_final_message with add_generation_prompt left on (its default), or without a
    final assistant message: a 400 naming continue_final_message, as chat's."""
    body = {"messages": messages, "continue_final_message": True, **extra}
    resp = httpx.post(server.base_url + "/tokenize", json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "continue_final_message"
    # The accepted form (add_generation_prompt false, a final assistant message) is rendered by
    # a real template in test_vllm_compat.py (this module's fake engine renders no template).
