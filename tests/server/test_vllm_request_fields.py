"""vLLM's request extras through the official `openai` client (vLLM fields in `extra_body`),
against a real server on the tiny random Llama whose tokenizer adds a BOS token to text
(so add_special_tokens shows), started with vLLM's --return-tokens-as-token-ids:
truncate_prompt_tokens, return_token_ids,
return_tokens_as_token_ids, add_special_tokens, cache_salt; completions and chat, streamed
and not, and their bad values (400 in OpenAI's error shape, naming the field)."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from server_harness import openai_client, start_server, tiny_model_args

openai = pytest.importorskip("openai")

PROMPT = "The quick brown fox jumps over the lazy dog, and then the dog"
MESSAGES = [{"role": "user", "content": "Paged attention stores keys and values."}]
BOS_ID = 0  # "<|endoftext|>", the tiny tokenizer's first special token


@pytest.fixture(scope="module")
def bos_model_dir(tiny_llama_dir, tmp_path_factory) -> str:
    """The tiny Llama with a tokenizer that puts BOS before every text it encodes with
    add_special_tokens (as Llama's does); its chat template writes no BOS."""
    from tokenizers import Tokenizer, processors

    out = str(tmp_path_factory.mktemp("tiny_bos"))
    shutil.copytree(tiny_llama_dir, out, dirs_exist_ok=True)
    tok = Tokenizer.from_file(f"{out}/tokenizer.json")
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", BOS_ID)])
    tok.save(f"{out}/tokenizer.json")
    with open(f"{out}/tokenizer_config.json") as f:
        config = json.load(f)
    config["bos_token"] = "<|endoftext|>"
    with open(f"{out}/tokenizer_config.json", "w") as f:
        json.dump(config, f)
    return out


@pytest.fixture(scope="module")
def server(bos_model_dir, tmp_path_factory):
    running = start_server(str(tmp_path_factory.mktemp("server")),
                           *tiny_model_args(bos_model_dir, "--return-tokens-as-token-ids"))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


def _tokens(http, model, **body) -> list[int]:
    resp = http.post("/tokenize", json={"model": model, **body})
    assert resp.status_code == 200, resp.text
    return resp.json()["tokens"]


def _bad_request(call, param: str) -> str:
    """The message of the 400 `call` gets; it must be OpenAI's error shape naming `param`."""
    with pytest.raises(openai.BadRequestError) as info:
        call()
    error = info.value.body
    assert info.value.status_code == 400 and error["param"] == param, error
    assert error["type"] == "invalid_request_error" and error["message"]
    return error["message"]


GREEDY = {"temperature": 0, "max_tokens": 4}


# ---- truncate_prompt_tokens -----------------------------------------------------------------


def test_truncate_prompt_tokens_keeps_the_last_k_tokens(client, http, model):
    ids = _tokens(http, model, prompt=PROMPT)
    assert ids[0] == BOS_ID and len(ids) > 8
    cut = client.completions.create(model=model, prompt=PROMPT, **GREEDY,
                                    extra_body={"truncate_prompt_tokens": 5, "ignore_eos": True})
    same = client.completions.create(model=model, prompt=ids[-5:], **GREEDY,
                                     extra_body={"ignore_eos": True})
    assert cut.usage.prompt_tokens == 5
    assert cut.choices[0].text == same.choices[0].text
    stream = client.completions.create(
        model=model, prompt=PROMPT, **GREEDY, stream=True,
        stream_options={"include_usage": True},
        extra_body={"truncate_prompt_tokens": 5, "ignore_eos": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == cut.choices[0].text
    assert chunks[-1].usage.prompt_tokens == 5


def test_truncate_prompt_tokens_in_chat(client, http, model):
    full = _tokens(http, model, messages=MESSAGES)
    whole = client.chat.completions.create(model=model, messages=MESSAGES, **GREEDY)
    assert whole.usage.prompt_tokens == len(full)
    cut = client.chat.completions.create(model=model, messages=MESSAGES, **GREEDY,
                                         extra_body={"truncate_prompt_tokens": 6})
    same = client.completions.create(model=model, prompt=full[-6:], **GREEDY)
    assert cut.usage.prompt_tokens == 6
    assert cut.choices[0].message.content == same.choices[0].text
    stream = client.chat.completions.create(
        model=model, messages=MESSAGES, **GREEDY, stream=True,
        stream_options={"include_usage": True}, extra_body={"truncate_prompt_tokens": 6})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == cut.choices[0].message.content and chunks[-1].usage.prompt_tokens == 6


def test_truncate_minus_one_fits_a_long_prompt_to_the_context(client, model):
    long_prompt = [5, 6, 7, 8] * 200  # 800 tokens; the context holds 512
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt=long_prompt, max_tokens=4)
    out = client.completions.create(model=model, prompt=long_prompt, max_tokens=4,
                                    extra_body={"truncate_prompt_tokens": -1})
    assert out.usage.prompt_tokens == 512 - 4  # vLLM's: max_model_len - max_tokens
    text = "word " * 3000  # past what the front end lets through untruncated
    out = client.completions.create(model=model, prompt=text, max_tokens=2,
                                    extra_body={"truncate_prompt_tokens": 100})
    assert out.usage.prompt_tokens == 100


def test_truncate_prompt_tokens_bad_values(client, model):
    for value in (0, -2, 512 - 4 + 1, "5", 1.5):
        _bad_request(lambda: client.completions.create(
            model=model, prompt=PROMPT, max_tokens=4,
            extra_body={"truncate_prompt_tokens": value}), "truncate_prompt_tokens")
        _bad_request(lambda: client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=4, stream=True,
            extra_body={"truncate_prompt_tokens": value}), "truncate_prompt_tokens")
    message = _bad_request(lambda: client.completions.create(
        model=model, prompt=PROMPT, max_tokens=4, extra_body={"truncate_prompt_tokens": 600}),
        "truncate_prompt_tokens")
    assert "508" in message  # the largest k this request could take


# ---- return_token_ids, return_tokens_as_token_ids -------------------------------------------


def _stream_ids(chunks, prompt_where: str) -> tuple[list[int], list[list[int]]]:
    """(every chunk's token_ids joined, the prompt_token_ids each chunk carried or [])."""
    ids, prompts = [], []
    for c in chunks:
        if not c.choices:
            continue
        ids += c.choices[0].token_ids
        holder = c.choices[0] if prompt_where == "choice" else c
        prompts.append(getattr(holder, "prompt_token_ids", None) or [])
    return ids, prompts


def test_return_token_ids_in_completions(client, http, model):
    prompts = [PROMPT, "Hello world"]
    out = client.completions.create(model=model, prompt=prompts, **GREEDY, logprobs=2,
                                    extra_body={"return_token_ids": True, "ignore_eos": True})
    for prompt, choice in zip(prompts, out.choices):
        assert choice.prompt_token_ids == _tokens(http, model, prompt=prompt)
        assert len(choice.token_ids) == 4
        # The server's --return-tokens-as-token-ids names logprobs tokens by id.
        assert choice.logprobs.tokens == [f"token_id:{t}" for t in choice.token_ids]
        assert all(k.startswith("token_id:") for top in choice.logprobs.top_logprobs for k in top)
    assert out.usage.prompt_tokens == sum(len(c.prompt_token_ids) for c in out.choices)
    stream = client.completions.create(model=model, prompt=PROMPT, **GREEDY, stream=True,
                                       extra_body={"return_token_ids": True, "ignore_eos": True})
    ids, prompt_ids = _stream_ids(list(stream), "choice")
    assert ids == out.choices[0].token_ids
    assert prompt_ids[0] == out.choices[0].prompt_token_ids and not any(prompt_ids[1:])
    plain = client.completions.create(model=model, prompt=PROMPT, **GREEDY, logprobs=1,
                                      extra_body={"return_tokens_as_token_ids": False})
    assert getattr(plain.choices[0], "token_ids", None) is None
    assert not any(t.startswith("token_id:") for t in plain.choices[0].logprobs.tokens)


def test_return_token_ids_in_chat(client, http, model):
    out = client.chat.completions.create(model=model, messages=MESSAGES, **GREEDY, n=2,
                                         logprobs=True, top_logprobs=2,
                                         extra_body={"return_token_ids": True})
    assert out.prompt_token_ids == _tokens(http, model, messages=MESSAGES)  # on the response
    for choice in out.choices:
        assert 1 <= len(choice.token_ids) <= 4
        entries = choice.logprobs.content
        assert [e.token for e in entries] == [f"token_id:{t}" for t in choice.token_ids]
        assert all(alt.token.startswith("token_id:") for e in entries for alt in e.top_logprobs)
        assert entries[0].bytes == list(entries[0].token.encode())
    stream = client.chat.completions.create(model=model, messages=MESSAGES, **GREEDY,
                                            stream=True, extra_body={"return_token_ids": True})
    ids, prompt_ids = _stream_ids(list(stream), "response")
    assert ids == out.choices[0].token_ids
    assert prompt_ids[0] == out.prompt_token_ids and not any(prompt_ids[1:])
    plain = client.chat.completions.create(
        model=model, messages=MESSAGES, **GREEDY, logprobs=True,
        extra_body={"return_tokens_as_token_ids": False})
    assert getattr(plain, "prompt_token_ids", None) is None
    assert not any(e.token.startswith("token_id:") for e in plain.choices[0].logprobs.content)


def test_token_id_fields_bad_values(client, model):
    for field, value in (("return_token_ids", "yes"), ("return_tokens_as_token_ids", 1)):
        _bad_request(lambda: client.completions.create(
            model=model, prompt=PROMPT, max_tokens=2, extra_body={field: value}), field)
        _bad_request(lambda: client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=2, stream=True,
            extra_body={field: value}), field)


# ---- add_special_tokens ---------------------------------------------------------------------


def test_add_special_tokens_completions_default_true(client, http, model):
    with_bos = _tokens(http, model, prompt=PROMPT)
    assert with_bos[0] == BOS_ID
    default = client.completions.create(model=model, prompt=PROMPT, **GREEDY,
                                        extra_body={"return_token_ids": True})
    assert default.choices[0].prompt_token_ids == with_bos
    bare = client.completions.create(model=model, prompt=PROMPT, **GREEDY,
                                     extra_body={"return_token_ids": True,
                                                 "add_special_tokens": False})
    assert bare.choices[0].prompt_token_ids == with_bos[1:]
    assert bare.usage.prompt_tokens == default.usage.prompt_tokens - 1
    stream = client.completions.create(
        model=model, prompt=PROMPT, **GREEDY, stream=True, stream_options={"include_usage": True},
        extra_body={"add_special_tokens": False})
    assert list(stream)[-1].usage.prompt_tokens == len(with_bos) - 1
    # Token-id prompts are taken as given either way.
    ids = client.completions.create(model=model, prompt=with_bos[1:], **GREEDY,
                                    extra_body={"add_special_tokens": True})
    assert ids.usage.prompt_tokens == len(with_bos) - 1


def test_add_special_tokens_chat_default_false(client, http, model):
    rendered = _tokens(http, model, messages=MESSAGES)
    assert rendered[0] != BOS_ID  # the template writes no BOS, and none is added
    default = client.chat.completions.create(model=model, messages=MESSAGES, **GREEDY,
                                             extra_body={"return_token_ids": True})
    assert default.prompt_token_ids == rendered
    added = client.chat.completions.create(model=model, messages=MESSAGES, **GREEDY,
                                           extra_body={"return_token_ids": True,
                                                       "add_special_tokens": True})
    assert added.prompt_token_ids == [BOS_ID, *rendered]
    stream = client.chat.completions.create(
        model=model, messages=MESSAGES, **GREEDY, stream=True,
        stream_options={"include_usage": True}, extra_body={"add_special_tokens": True})
    assert list(stream)[-1].usage.prompt_tokens == len(rendered) + 1


def test_add_special_tokens_bad_values(client, model):
    _bad_request(lambda: client.completions.create(
        model=model, prompt=PROMPT, max_tokens=2, extra_body={"add_special_tokens": "no"}),
        "add_special_tokens")
    _bad_request(lambda: client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=2, extra_body={"add_special_tokens": 0}),
        "add_special_tokens")


# ---- cache_salt -----------------------------------------------------------------------------


def _cached(usage) -> int:
    return usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0


def test_cache_salt_isolates_prefix_cache_hits(client, model):
    prompt = "cache salt completions. " + PROMPT * 4  # several blocks, seen by no other test

    def cached(**extra) -> int:
        out = client.completions.create(model=model, prompt=prompt, max_tokens=1,
                                        extra_body=extra)
        return _cached(out.usage)

    assert cached(cache_salt="tenant-a") == 0
    assert cached(cache_salt="tenant-b") == 0  # same prompt, other tenant: no hit
    assert cached(cache_salt="tenant-a") > 0  # its own blocks
    assert cached() == 0  # unsalted requests never see salted blocks
    assert cached() > 0


def test_cache_salt_in_streamed_chat(client, model):
    messages = [{"role": "user", "content": "cache salt chat. " + PROMPT * 4}]

    def cached(salt: str) -> int:
        stream = client.chat.completions.create(
            model=model, messages=messages, max_tokens=1, stream=True,
            stream_options={"include_usage": True}, extra_body={"cache_salt": salt})
        return _cached(list(stream)[-1].usage)

    assert cached("c") == 0 and cached("d") == 0 and cached("c") > 0


def test_cache_salt_bad_values(client, model):
    for value in ("", 5, "x" * 1025):
        _bad_request(lambda: client.completions.create(
            model=model, prompt=PROMPT, max_tokens=2, extra_body={"cache_salt": value}),
            "cache_salt")
        _bad_request(lambda: client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=2, stream=True,
            extra_body={"cache_salt": value}), "cache_salt")


def test_echo_shows_the_truncated_prompt(client, http, model):
    ids = _tokens(http, model, prompt=PROMPT)
    kept = http.post("/detokenize", json={"model": model, "tokens": ids[-5:]}).json()["prompt"]
    out = client.completions.create(model=model, prompt=PROMPT, **GREEDY, echo=True,
                                    extra_body={"truncate_prompt_tokens": 5})
    assert out.choices[0].text.startswith(kept) and not out.choices[0].text.startswith(PROMPT)


def test_truncation_side_right_keeps_the_first_k(client, http, model):
    ids = _tokens(http, model, prompt=PROMPT)
    out = client.completions.create(model=model, prompt=PROMPT, **GREEDY, extra_body={
        "truncate_prompt_tokens": 5, "truncation_side": "right", "return_token_ids": True})
    assert out.choices[0].prompt_token_ids == ids[:5] and out.usage.prompt_tokens == 5
    chat_ids = _tokens(http, model, messages=MESSAGES)
    stream = client.chat.completions.create(
        model=model, messages=MESSAGES, **GREEDY, stream=True, extra_body={
            "truncate_prompt_tokens": 6, "truncation_side": "right", "return_token_ids": True})
    assert _stream_ids(list(stream), "response")[1][0] == chat_ids[:6]
    _bad_request(lambda: client.completions.create(
        model=model, prompt=PROMPT, max_tokens=2,
        extra_body={"truncate_prompt_tokens": 5, "truncation_side": "middle"}), "truncation_side")


def test_tokenize_takes_add_special_tokens_for_chats_too(http, model):
    rendered = _tokens(http, model, messages=MESSAGES)  # vLLM's default for a chat: none added
    assert _tokens(http, model, messages=MESSAGES, add_special_tokens=True) == [BOS_ID, *rendered]
    assert _tokens(http, model, prompt=PROMPT, add_special_tokens=False) == \
        _tokens(http, model, prompt=PROMPT)[1:]
