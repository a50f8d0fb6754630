"""A chat message sent while a long document's step computes gets its first token from inside
that step (interjection, --interject-short-prompts), through the real server and engine loop.

The engine is the timed fake (timed_engine.py): a step sleeps 1 ms per prompt token in ten
slices with a poll for arrivals between them, so the document's single step takes ~2 s. The
chat is sent once the engine reports the document running (its stats heartbeat, every 0.5 s,
also inside a step; not after a fixed sleep: on a loaded host the document may reach its step
late) and is noticed within a slice (~0.2 s). Without interjection it would wait for the whole
step.
"""

from __future__ import annotations

import threading
import time

import openai
import pytest

from server_harness import openai_client, start_server

DOC = "Paged attention keeps keys and values in blocks. " * 40  # 2000 characters = tokens
STEP_S = 2.0


@pytest.fixture(scope="module", params=["on", "off"])
def server(request, tmp_path_factory):
    flag = "--interject-short-prompts" if request.param == "on" else "--no-interject-short-prompts"
    srv = start_server(str(tmp_path_factory.mktemp("interject")), "--engine-factory",
                       "timed_engine:build_timed_engine", "--policy", "chunked",
                       "--max-num-batched-tokens", "4096", "--max-num-partial-prefills", "2",
                       flag)
    srv.interject = request.param == "on"
    yield srv
    srv.stop()


def _first_token_s(client: openai.OpenAI, prompt: str, t0: float, out: dict, key: str) -> None:
    stream = client.completions.create(model="timed-fake", prompt=prompt, max_tokens=3,
                                       stream=True, temperature=0.0)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text and key not in out:
            out[key] = time.monotonic() - t0
    out[key + "_done"] = True


def _wait_until_running(server, got: dict) -> None:
    """Until the engine reports the document's request running (its step has started), not a
    fixed sleep: on a loaded host the document may take a while to reach the engine."""
    deadline = time.monotonic() + 30
    while server.metrics().get("cadence:num_requests_running", 0) < 1:
        assert "doc" not in got, f"the document finished before it was seen running: {got}"
        assert time.monotonic() < deadline, "the document never started"
        time.sleep(0.02)


def test_a_chat_sent_mid_document_gets_its_first_token_before_the_document(server):
    client = openai_client(server)
    client.completions.create(model="timed-fake", prompt="warm", max_tokens=1)
    got: dict = {}
    t0 = time.monotonic()
    doc = threading.Thread(target=_first_token_s, args=(client, DOC, t0, got, "doc"))
    doc.start()
    if server.interject:
        _wait_until_running(server, got)
    else:
        # Without interjection the chat waits for the step's end whenever it arrives (in the
        # same step if the document is not running yet): sent 0.5 s after it, > 1.5 s.
        time.sleep(0.5)
    t_chat = time.monotonic()
    _first_token_s(client, "What is the capital of France?", t_chat, got, "chat")
    doc.join(timeout=60)
    assert got.get("doc_done") and got.get("chat_done")
    chat_ttft, doc_ttft = got["chat"], got["doc"]
    if server.interject:
        # Noticed within a slice (0.2 s) of the 2 s step, answered before the step's end
        # (the document's first token): not after it, as without interjection.
        assert chat_ttft < STEP_S, got
        assert t_chat - t0 + chat_ttft < doc_ttft, got
        metrics = server.metrics()
        assert metrics.get("cadence:num_interjections_total", 0) >= 1
    else:
        # It waits for the document's step to end (~1.5 s more).
        assert chat_ttft > 1.0, got


def test_tokenize_is_answered_during_a_long_step(server):
    # A cache-aware router tokenizes every request on a replica before routing it: the answer
    # comes from inside the document's step (its polls), interjection on or off, not at its end.
    import httpx

    client = openai_client(server)
    got: dict = {}
    t0 = time.monotonic()
    # Not the other test's document: its blocks are cached, its step would be short.
    fresh_doc = "Tokenize me. " + DOC[13:]
    doc = threading.Thread(target=_first_token_s, args=(client, fresh_doc, t0, got, "doc"))
    doc.start()
    _wait_until_running(server, got)
    t_ask = time.monotonic()
    resp = httpx.post(server.v1.removesuffix("/v1") + "/tokenize", timeout=30,
                      json={"prompt": "What is the capital of France?"})
    answered = time.monotonic() - t_ask
    doc.join(timeout=60)
    assert resp.status_code == 200 and resp.json()["tokens"]
    assert got.get("doc_done")
    # Within a slice or two of the 2 s step, before its end (the document's first token).
    assert answered < STEP_S and t_ask - t0 + answered < got["doc"], (answered, got)
