"""64 concurrent streams of mixed lengths, a quarter disconnecting early (tiny random Llama).

Every finished stream's text equals the same request run alone (greedy), no request is lost,
the KV pool is fully free afterwards, and /metrics counts match what was sent.
"""

from __future__ import annotations

import asyncio
import random
import time

import openai
import pytest

NUM_STREAMS = 64
READ_BEFORE_DISCONNECT = 3
MAX_MODEL_LEN = 512  # the tiny Llama's max_position_embeddings (tests/conftest.py)


def _specs(vocab_size: int) -> list[dict]:
    rng = random.Random(7)
    specs = []
    for i in range(NUM_STREAMS):
        disconnect = i % 4 == 3
        # Token-id prompts: their lengths are known exactly for the metrics check.
        prompt = [rng.randrange(3, vocab_size) for _ in range(rng.randrange(4, 120))]
        specs.append({
            "index": i,
            "prompt": prompt,
            # The leavers ask for the whole context (hundreds of steps, where they read 3
            # chunks), so they are still running when they leave even on a loaded host whose
            # client lags the server (200 tokens once finished before the disconnect arrived).
            "max_tokens": MAX_MODEL_LEN - len(prompt) if disconnect else rng.randrange(1, 40),
            "disconnect": disconnect,
        })
    return specs


async def _run_stream(client: openai.AsyncOpenAI, model: str, spec: dict) -> dict:
    stream = await client.completions.create(
        model=model, prompt=spec["prompt"], max_tokens=spec["max_tokens"], temperature=0,
        stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": spec["disconnect"]})
    text, finish, usage, n = [], None, None, 0
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
            continue
        text.append(chunk.choices[0].text)
        finish = chunk.choices[0].finish_reason or finish
        n += 1
        if spec["disconnect"] and n == READ_BEFORE_DISCONNECT:
            await stream.close()
            return {"left": True}
    return {"left": False, "text": "".join(text), "finish": finish, "usage": usage}


@pytest.mark.timeout(300)
def test_concurrent_streams_match_solo_runs_and_free_the_pool(tiny_server, tiny_tokenizer):
    specs = _specs(tiny_tokenizer.vocab_size)
    before = tiny_server.metrics()

    async def main():
        client = openai.AsyncOpenAI(base_url=tiny_server.v1, api_key="x", max_retries=0,
                                    timeout=120)
        model = (await client.models.list()).data[0].id
        results = await asyncio.gather(*(_run_stream(client, model, s) for s in specs))
        solos = {}
        for spec, res in zip(specs, results):
            if not res["left"]:
                solo = await client.completions.create(
                    model=model, prompt=spec["prompt"], max_tokens=spec["max_tokens"],
                    temperature=0)
                solos[spec["index"]] = solo
        await client.close()
        return results, solos

    results, solos = asyncio.run(main())

    finished = [(s, r) for s, r in zip(specs, results) if not r["left"]]
    assert len(finished) == NUM_STREAMS * 3 // 4
    for spec, res in finished:
        solo = solos[spec["index"]]
        assert res["text"] == solo.choices[0].text, f"stream {spec['index']} differs"
        assert res["finish"] == solo.choices[0].finish_reason in ("stop", "length")
        assert res["usage"].prompt_tokens == len(spec["prompt"])
        assert res["usage"].completion_tokens == solo.usage.completion_tokens

    # The pool drains within a few steps of the last disconnect.
    deadline = time.monotonic() + 20
    while True:
        m = tiny_server.metrics()
        if m["cadence:kv_cache_blocks_used"] == 0 and m["cadence:num_requests_running"] == 0:
            break
        assert time.monotonic() < deadline, f"KV blocks still used: {m}"
        time.sleep(0.1)
    assert m["cadence:num_requests_waiting"] == 0

    def delta(name: str) -> float:
        return m.get(name, 0.0) - before.get(name, 0.0)

    num_left = NUM_STREAMS // 4
    num_done = len(finished) * 2  # each finished once streamed, once solo
    ok = delta("cadence:request_success_total{finished_reason=stop}") + delta(
        "cadence:request_success_total{finished_reason=length}")
    assert ok == num_done
    assert delta("cadence:request_success_total{finished_reason=abort}") == num_left
    assert delta("cadence:e2e_request_latency_seconds_count") == num_done + num_left
    assert delta("cadence:time_to_first_token_seconds_count") == num_done + num_left
    sent_prompt_tokens = sum(len(s["prompt"]) for s in specs) + sum(
        len(s["prompt"]) for s, _ in finished)
    assert delta("cadence:prompt_tokens_total") == sent_prompt_tokens
    completed_tokens = sum(r["usage"].completion_tokens for _, r in finished) * 2
    left_min_tokens = num_left * READ_BEFORE_DISCONNECT
    assert delta("cadence:generation_tokens_total") >= completed_tokens + left_min_tokens
