"""Prompt logprobs over HTTP with the official `openai` client, as lm-evaluation-harness's
`local-completions` and vLLM users send them.

- /v1/completions echo + logprobs: text is prompt + completion; logprobs cover the prompt's
  tokens (first null) then the generated ones; max_tokens 0 shows the prompt alone; string,
  token-id and batched prompts, n > 1, streamed and not.
- vLLM's `prompt_logprobs` on completions (per choice) and chat (top level).
- Bad values get a 400 in OpenAI's error shape.
Values are checked against a transformers full-sequence forward of the same tiny model.
"""

from __future__ import annotations

import math

import pytest
import torch

openai = pytest.importorskip("openai")

PROMPT = "The quick brown fox jumps over the lazy dog, and then the dog"
OTHER = "Paged attention stores keys and values."
TOL = 2e-3


@pytest.fixture(scope="module")
def reference(tiny_llama_dir, tiny_tokenizer):
    """text or ids -> (ids, log_softmax [P, V]) of one full forward in transformers."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama_dir,
                                                          dtype=torch.float32).eval()
    cache = {}

    def ref(prompt):
        ids = list(prompt) if not isinstance(prompt, str) else tiny_tokenizer.encode(prompt)
        key = tuple(ids)
        if key not in cache:
            with torch.no_grad():
                cache[key] = hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)
        return ids, cache[key]
    return ref


def check_echo(lp, ids, ref, n_alt, num_generated):
    """Legacy logprobs of an echoed prompt (+ num_generated tokens)."""
    assert len(lp.tokens) == len(ids) + num_generated
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for p in range(1, len(ids)):
        assert lp.token_logprobs[p] == pytest.approx(ref[p - 1, ids[p]].item(), abs=TOL)
        top = lp.top_logprobs[p]
        # The top n_alt alternatives, plus the prompt token when it is not among them (keyed
        # by text: partial UTF-8 tokens that share one keep the likeliest).
        assert 1 <= len(top) <= n_alt + 1
        best = ref[p - 1].topk(n_alt).values
        assert max(top.values()) == pytest.approx(best[0].item(), abs=TOL)
    for p in range(len(ids), len(ids) + num_generated):
        assert lp.token_logprobs[p] is not None and len(lp.top_logprobs[p]) >= 1
    offsets = lp.text_offset
    assert offsets[0] == 0 and offsets == sorted(offsets)


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echo_logprobs_string_prompt(client, model, reference, max_tokens):
    """lm-evaluation-harness's loglikelihood request."""
    out = client.completions.create(model=model, prompt=PROMPT, echo=True, logprobs=3,
                                    max_tokens=max_tokens, temperature=0)
    choice = out.choices[0]
    ids, ref = reference(PROMPT)
    assert choice.text.startswith(PROMPT)
    if max_tokens == 0:
        assert choice.text == PROMPT
    check_echo(choice.logprobs, ids, ref, 3, max_tokens)
    assert out.usage.prompt_tokens == len(ids)
    # The sum lm-eval takes over a continuation: finite, and what the reference gives.
    total = sum(choice.logprobs.token_logprobs[1:len(ids)])
    assert math.isfinite(total)
    assert total == pytest.approx(sum(ref[p - 1, ids[p]].item() for p in range(1, len(ids))),
                                  abs=TOL * len(ids))


def test_echo_logprobs_token_ids_and_two_prompts(client, model, reference, tiny_tokenizer):
    ids_prompt = tiny_tokenizer.encode(OTHER)
    out = client.completions.create(model=model, prompt=[PROMPT, OTHER], echo=True, logprobs=1,
                                    max_tokens=0, temperature=0)
    assert [c.text for c in out.choices] == [PROMPT, OTHER]
    for choice, prompt in zip(out.choices, [PROMPT, OTHER]):
        ids, ref = reference(prompt)
        check_echo(choice.logprobs, ids, ref, 1, 0)
    by_ids = client.completions.create(model=model, prompt=ids_prompt, echo=True, logprobs=1,
                                       max_tokens=0, temperature=0)
    assert by_ids.choices[0].logprobs.token_logprobs == \
        out.choices[1].logprobs.token_logprobs


def test_echo_logprobs_with_n(client, model, reference):
    out = client.completions.create(model=model, prompt=OTHER, echo=True, logprobs=2,
                                    max_tokens=3, n=2, temperature=0.9, seed=5,
                                    extra_body={"ignore_eos": True})
    ids, ref = reference(OTHER)
    assert len(out.choices) == 2
    for choice in out.choices:
        assert choice.text.startswith(OTHER)
        check_echo(choice.logprobs, ids, ref, 2, 3)


@pytest.mark.parametrize("max_tokens", [0, 2])
def test_echo_logprobs_streamed(client, model, reference, max_tokens):
    stream = client.completions.create(model=model, prompt=PROMPT, echo=True, logprobs=2,
                                       max_tokens=max_tokens, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = [c for c in stream if c.choices]
    first = chunks[0].choices[0]
    ids, ref = reference(PROMPT)
    assert first.text.startswith(PROMPT)
    tokens, lps = [], []
    for c in chunks:
        if c.choices[0].logprobs is not None:
            tokens += c.choices[0].logprobs.tokens
            lps += c.choices[0].logprobs.token_logprobs
    assert len(tokens) == len(ids) + max_tokens and lps[0] is None
    for p in range(1, len(ids)):
        assert lps[p] == pytest.approx(ref[p - 1, ids[p]].item(), abs=TOL)
    text = "".join(c.choices[0].text for c in chunks)
    assert text == PROMPT if max_tokens == 0 else text.startswith(PROMPT)
    assert chunks[-1].choices[0].finish_reason == "length"


def _check_vllm_entries(entries, ids, ref, k):
    assert len(entries) == len(ids) and entries[0] is None
    for p in range(1, len(ids)):
        entry = entries[p]
        mine = entry[str(ids[p])]
        assert mine["logprob"] == pytest.approx(ref[p - 1, ids[p]].item(), abs=TOL)
        assert mine["rank"] >= 1 and isinstance(mine["decoded_token"], str)
        assert k <= len(entry) <= k + 1


def test_prompt_logprobs_field_on_completions(client, model, reference):
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=2, temperature=0,
                                    extra_body={"prompt_logprobs": 2})
    ids, ref = reference(PROMPT)
    choice = out.choices[0].model_dump()
    _check_vllm_entries(choice["prompt_logprobs"], ids, ref, 2)
    assert out.choices[0].logprobs is None  # logprobs of the output were not asked for


def test_prompt_logprobs_field_on_chat(client, model, reference, tiny_tokenizer):
    messages = [{"role": "user", "content": PROMPT}]
    out = client.chat.completions.create(model=model, messages=messages, max_tokens=2,
                                         temperature=0, extra_body={"prompt_logprobs": 0})
    entries = out.model_dump()["prompt_logprobs"]
    ids = [int(next(iter(e))) for e in entries[1:]]
    assert len(entries) == out.usage.prompt_tokens and entries[0] is None
    full_ids, ref = reference(tiny_tokenizer.encode(
        tiny_tokenizer.apply_chat_template(messages, add_generation_prompt=True),
        add_special_tokens=False))
    assert ids == full_ids[1:]
    _check_vllm_entries(entries, full_ids, ref, 0)


@pytest.mark.parametrize("body", [
    {"prompt_logprobs": 21}, {"prompt_logprobs": -1},
    {"prompt_logprobs": 1, "stream": True},
])
@pytest.mark.parametrize("path", ["completions", "chat"])
def test_bad_prompt_logprobs_are_400(client, model, body, path):
    body = dict(body)  # the parameter is shared by both paths
    with pytest.raises(openai.BadRequestError) as info:
        if path == "completions":
            stream = body.pop("stream", False)
            client.completions.create(model=model, prompt=PROMPT, max_tokens=1, stream=stream,
                                      extra_body=body)
        else:
            stream = body.pop("stream", False)
            client.chat.completions.create(model=model, max_tokens=1, stream=stream,
                                           messages=[{"role": "user", "content": "hi"}],
                                           extra_body=body)
    err = info.value.body
    assert info.value.status_code == 400 and "prompt_logprobs" in str(err)


def test_max_tokens_zero_needs_echo(client, model):
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=model, prompt=PROMPT, max_tokens=0)


def test_tokenizer_info_lets_a_client_tokenize_remotely(tiny_server, tiny_tokenizer):
    """lm-evaluation-harness's remote tokenizer: GET /tokenizer_info must name eos_token, and
    POST /tokenize of that text (add_special_tokens false) must give the EOS id back."""
    import httpx

    info = httpx.get(tiny_server.base_url + "/tokenizer_info", timeout=60).json()
    assert info["eos_token"] == tiny_tokenizer.eos_token
    assert info["bos_token"] == tiny_tokenizer.bos_token
    assert info["chat_template"] == tiny_tokenizer.chat_template
    assert info["model_max_length"] > 0
    ids = httpx.post(tiny_server.base_url + "/tokenize", timeout=60,
                     json={"prompt": info["eos_token"], "add_special_tokens": False}).json()
    assert ids["tokens"] == [tiny_tokenizer.eos_token_id]


def test_lm_eval_loglikelihood_batches_concurrently(tiny_server, model, reference, tiny_tokenizer):
    """lm-eval's request exactly (token-id prompts, several per request, max_tokens 1,
    logprobs 1, echo, seed) from two threads at once: it sums token_logprobs[ctxlen:-1] of the
    choices sorted by index, so each choice must hold its own prompt's entries."""
    import concurrent.futures

    import httpx

    texts = [PROMPT, OTHER, "Prefix caching shares blocks", "A fourth prompt"]
    batches = [[tiny_tokenizer.encode(t) for t in texts[:2]],
               [tiny_tokenizer.encode(t) for t in texts[2:]]]

    def post(prompts):
        r = httpx.post(tiny_server.base_url + "/v1/completions", timeout=120, json={
            "model": model, "prompt": prompts, "temperature": 0, "max_tokens": 1,
            "logprobs": 1, "seed": 1234, "echo": True})
        assert r.status_code == 200, r.text
        return r.json()

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(post, batches))
    for prompts, out in zip(batches, outs):
        choices = sorted(out["choices"], key=lambda c: c["index"])
        assert [c["index"] for c in choices] == list(range(len(prompts)))
        for ids, choice in zip(prompts, choices):
            _, ref = reference(ids)
            lp = choice["logprobs"]
            assert len(lp["token_logprobs"]) == len(ids) + 1  # the prompt + one generated
            ctxlen = 1
            want = sum(ref[p - 1, ids[p]].item() for p in range(ctxlen, len(ids)))
            assert sum(lp["token_logprobs"][ctxlen:-1]) == pytest.approx(want, abs=5e-3)
            for tok, top in zip(lp["token_logprobs"][ctxlen:-1], lp["top_logprobs"][ctxlen:-1]):
                assert tok <= max(top.values()) + 1e-6


# prompt_logprobs by value class, as vLLM answers each (its protocol's check_logprobs and
# max-logprobs check): None and 0 are taken streamed too (a stream returns none), k > 0 only
# unstreamed, -1 (the whole vocabulary) is over the 20 cap, other negatives and > 20 refused.
ACCEPTED = {(None, False), (None, True), (0, False), (0, True), (2, False)}


@pytest.mark.parametrize("value", [None, 0, 2, -1, -2, 21])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["completions", "chat"])
def test_prompt_logprobs_value_classes_as_vllm(client, model, path, stream, value):
    extra = {} if value is None else {"prompt_logprobs": value}
    messages = [{"role": "user", "content": "hi"}]

    def send():
        if path == "completions":
            return client.completions.create(model=model, prompt=PROMPT, max_tokens=2,
                                             temperature=0, stream=stream, extra_body=extra)
        return client.chat.completions.create(model=model, messages=messages, max_tokens=2,
                                              temperature=0, stream=stream, extra_body=extra)

    if (value, stream) not in ACCEPTED:
        with pytest.raises(openai.BadRequestError) as info:
            out = send()
            list(out) if stream else out
        assert info.value.status_code == 400 and "prompt_logprobs" in str(info.value.body)
        return
    out = send()
    if stream:
        chunks = [c.model_dump() for c in out]
        assert chunks and not any("prompt_logprobs" in str(c) for c in chunks)
        return
    dumped = out.model_dump()
    entries = dumped["choices"][0].get("prompt_logprobs") if path == "completions" \
        else dumped.get("prompt_logprobs")
    if value is None:
        assert entries is None
        return
    assert entries[0] is None and len(entries) == out.usage.prompt_tokens
    # Each entry: the prompt token, plus up to `value` alternatives.
    assert all(1 <= len(e) <= value + 1 for e in entries[1:])
