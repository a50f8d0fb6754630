"""Results that differed from vLLM's for the same offline code (issue 32), one test each.

Written the way vLLM's docs spell the calls; the tiny random Llama keeps it fast.
"""

from __future__ import annotations

import pytest

from cadence import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(model=tiny_llama_dir, dtype="float32", seed=0, max_model_len=256,
               max_num_batched_tokens=64, max_num_seqs=8)


def _greedy(llm, prompt, **kw):
    params = SamplingParams(temperature=0, max_tokens=kw.pop("max_tokens", 10), ignore_eos=True, **kw)
    (out,) = llm.generate(prompt, params, use_tqdm=False)
    return out.outputs[0]


def test_stop_token_ids_text_is_left_out_unless_asked(llm):
    tok = llm.get_tokenizer()
    plain = _greedy(llm, "The capital of France is")
    ids = list(plain.token_ids)
    # The first token whose id did not come earlier: generation stops exactly there.
    k = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])
    stopped = _greedy(llm, "The capital of France is", stop_token_ids=[ids[k]])
    assert list(stopped.token_ids) == ids[:k + 1]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == ids[k]
    assert stopped.text == tok.decode(ids[:k], skip_special_tokens=True)
    kept = _greedy(llm, "The capital of France is", stop_token_ids=[ids[k]],
                   include_stop_str_in_output=True)
    assert kept.text == tok.decode(ids[:k + 1], skip_special_tokens=True)


def test_min_tokens_holds_back_stop_strings(llm):
    tok = llm.get_tokenizer()
    plain = _greedy(llm, "The capital of France is")
    first = tok.decode(plain.token_ids[:1], skip_special_tokens=True)
    assert first.strip()
    # Without min_tokens the first token's text stops it at once, with empty output.
    early = _greedy(llm, "The capital of France is", stop=[first])
    assert early.text == "" and len(early.token_ids) == 1
    # min_tokens=3: no stop condition applies to the first 3 tokens (vLLM's rule).
    held = _greedy(llm, "The capital of France is", stop=[first], min_tokens=3)
    assert len(held.token_ids) >= 3
    assert held.text.startswith(first)
    assert held.text == plain.text[:len(held.text)]


def test_apply_chat_template_tokenize_returns_ids(llm):
    tok = llm.get_tokenizer()
    messages = [{"role": "user", "content": "Hello"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert isinstance(text, str) and "Hello" in text
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    assert ids == tok.encode(text, add_special_tokens=False)
    # transformers' default is tokenize=True without the generation prompt.
    assert tok.apply_chat_template(messages) == tok.encode(
        tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)


def test_tokenizer_behaves_like_a_transformers_tokenizer(llm):
    tok = llm.get_tokenizer()
    enc = tok("Hello world")
    assert enc["input_ids"] == tok.encode("Hello world") == enc.input_ids
    assert enc["attention_mask"] == [1] * len(enc["input_ids"])
    assert tok(["a b", "c"])["input_ids"] == [tok.encode("a b"), tok.encode("c")]
    tokens = tok.convert_ids_to_tokens(enc["input_ids"])
    assert tok.convert_tokens_to_ids(tokens) == enc["input_ids"]
    assert tok.convert_ids_to_tokens(enc["input_ids"][0]) == tokens[0]
    assert tok.eos_token_id in tok.all_special_ids
    assert tok.eos_token in tok.all_special_tokens
    assert tok.pad_token_id is None or tok.pad_token_id in tok.all_special_ids
    ids = enc["input_ids"]
    # transformers' decode keeps special tokens unless told otherwise.
    assert tok.decode(ids) != tok.decode(ids, skip_special_tokens=True) or tok.bos_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == "Hello world"
    assert tok.batch_decode([ids], skip_special_tokens=True) == ["Hello world"]
    assert len(tok) >= tok.vocab_size - 1


def test_chat_takes_openai_content_parts_and_template_kwargs(llm):
    params = SamplingParams(temperature=0, max_tokens=3)
    # vLLM joins a message's text parts with a newline for a template that reads strings.
    plain = llm.chat([{"role": "user", "content": "Hello\nthere"}], params, use_tqdm=False)
    parts = llm.chat([{"role": "user", "content": [{"type": "text", "text": "Hello"},
                                                    {"type": "text", "text": "there"}]}],
                     params, use_tqdm=False, chat_template_kwargs={"enable_thinking": False})
    assert parts[0].prompt == plain[0].prompt
    assert parts[0].outputs[0].token_ids == plain[0].outputs[0].token_ids
    with pytest.raises(ValueError, match="text content parts"):
        llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                 params, use_tqdm=False)


# ---- vLLM's parameter and output types -----------------------------------------------------


def test_vllm_module_paths_and_types():
    from cadence.outputs import CompletionOutput, Logprob, RequestOutput  # noqa: F401
    from cadence.sampling_params import GuidedDecodingParams, RequestOutputKind
    from cadence.sampling_params import SamplingParams as SP

    assert SP is SamplingParams
    params = SP(max_tokens=None, output_kind=RequestOutputKind.FINAL_ONLY,
                guided_decoding=GuidedDecodingParams(choice=["a", "b"]))
    assert params.structured_outputs.choice == ("a", "b")
    with pytest.raises(ValueError, match="max_tokens must be an int or None"):
        SP(max_tokens="8")
    with pytest.raises(ValueError, match="logprobs=-1.*logprobs=20"):
        SP(logprobs=-1)


def test_logprob_objects_and_metrics(llm):
    tok = llm.get_tokenizer()
    (out,) = llm.generate("Hello world", SamplingParams(temperature=0, max_tokens=4, logprobs=3,
                                                         ignore_eos=True), use_tqdm=False)
    c = out.outputs[0]
    for token_id, entry in zip(c.token_ids, c.logprobs):
        lp = entry[token_id]
        assert lp.rank == 1  # greedy picks the most likely token
        assert lp.decoded_token == tok.decode([token_id])
        assert lp.logprob <= 0 and len(entry) >= 3
        assert sorted(e.rank for e in entry.values()) == list(range(1, len(entry) + 1))
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
    assert m.last_token_time == out.timeline.token_times[-1] and m.time_in_queue >= 0


def test_skip_special_tokens_and_detokenize(llm):
    tok = llm.get_tokenizer()
    eos = tok.eos_token_id
    forced = dict(temperature=0, max_tokens=2, ignore_eos=True, logit_bias={eos: 100})
    (plain,) = llm.generate("Hi", SamplingParams(**forced), use_tqdm=False)
    assert list(plain.outputs[0].token_ids) == [eos, eos] and plain.outputs[0].text == ""
    (kept,) = llm.generate("Hi", SamplingParams(**forced, skip_special_tokens=False,
                                                spaces_between_special_tokens=False),
                           use_tqdm=False)
    assert kept.outputs[0].text == tok.eos_token * 2
    (ids_only,) = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=3,
                                                    detokenize=False), use_tqdm=False)
    assert ids_only.outputs[0].text == "" and len(ids_only.outputs[0].token_ids) >= 1


def test_bad_words_allowed_token_ids_truncate_and_unbounded_max_tokens(llm):
    tok = llm.get_tokenizer()
    plain = _greedy(llm, "The capital of France is")
    first = plain.token_ids[0]
    word = tok.decode([first])
    banned = _greedy(llm, "The capital of France is", bad_words=[word.strip() or word])
    assert banned.token_ids[0] != first and first not in banned.token_ids
    allowed = _greedy(llm, "The capital of France is", allowed_token_ids=[5, 7, 11])
    assert set(allowed.token_ids) <= {5, 7, 11}
    (cut,) = llm.generate("one two three four five six", SamplingParams(
        temperature=0, max_tokens=2, truncate_prompt_tokens=3), use_tqdm=False)
    full_ids = tok.encode("one two three four five six")
    assert cut.prompt_token_ids == full_ids[-3:]
    (long,) = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=None, ignore_eos=True),
                           use_tqdm=False)
    assert len(long.prompt_token_ids) + len(long.outputs[0].token_ids) == 256  # max_model_len
    assert long.outputs[0].finish_reason == "length"


def test_grammar_forced_eos_ends_by_length_not_stop(llm):
    """Issue 31: a grammar whose matcher fails after the first token (llguidance's lexer: too
    many expressions) leaves only EOS allowed; that EOS is not the grammar's end, so the
    request ends with "length", never "stop". A grammar that completes still ends "stop"."""
    from cadence.sampling_params import StructuredOutputsParams

    (out,) = llm.generate("go", SamplingParams(
        temperature=0, max_tokens=4,
        structured_outputs=StructuredOutputsParams(regex="a{1000}{1000}")), use_tqdm=False)
    assert out.outputs[0].text == "a" and len(out.outputs[0].token_ids) == 2
    assert out.outputs[0].finish_reason == "length" and out.outputs[0].stop_reason is None
    (out,) = llm.generate("go", SamplingParams(
        temperature=0, max_tokens=8,
        structured_outputs=StructuredOutputsParams(regex="(yes|no)")), use_tqdm=False)
    assert out.outputs[0].text in ("yes", "no") and out.outputs[0].finish_reason == "stop"


def test_cache_salt_in_prompt_dicts_isolates_the_prefix_cache(llm):
    """vLLM's {"prompt": ..., "cache_salt": ...}: the same prompt under another salt (or none)
    finds none of a salted prompt's blocks; under its own salt it does."""
    prompt = "cache salt offline: " + "one two three four five six seven eight " * 4
    params = SamplingParams(temperature=0, max_tokens=1)

    def cached(**salt) -> int:
        (out,) = llm.generate({"prompt": prompt, **salt}, params, use_tqdm=False)
        return out.num_cached_tokens

    assert cached(cache_salt="a") == 0
    assert cached(cache_salt="b") == 0
    assert cached(cache_salt="a") > 0
    assert cached() == 0 and cached() > 0
    with pytest.raises(ValueError, match="cache_salt"):
        cached(cache_salt="")


def test_truncate_minus_one_keeps_what_the_context_leaves(llm):
    (out,) = llm.generate([list(range(3, 303))], SamplingParams(
        temperature=0, max_tokens=6, truncate_prompt_tokens=-1), use_tqdm=False)
    assert out.prompt_token_ids == list(range(3, 303))[-(256 - 6):]  # max_model_len - max_tokens


def test_tokenization_kwargs_truncate_either_side_as_the_server_does(llm):
    """vLLM's LLM.generate(..., tokenization_kwargs={"truncate_prompt_tokens": k,
    "truncation_side": ...}): left keeps the last k tokens, right the first k; the n > 1
    siblings run the same cut prompt; chat cuts the rendered conversation."""
    ids = list(range(3, 43))
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, n=2, seed=1)
    outs = {}
    for side in ("left", "right"):
        (out,) = llm.generate([ids], params, use_tqdm=False, tokenization_kwargs={
            "truncate_prompt_tokens": 8, "truncation_side": side})
        outs[side] = out
        assert len(out.outputs) == 2
    assert outs["left"].prompt_token_ids == ids[-8:]
    assert outs["right"].prompt_token_ids == ids[:8]
    # Each cut runs as that prompt given whole would.
    (whole,) = llm.generate([ids[:8]], params, use_tqdm=False)
    assert [o.token_ids for o in outs["right"].outputs] == [o.token_ids for o in whole.outputs]
    # SamplingParams' own (vLLM's deprecated spelling) takes the side from the keyword too.
    (own,) = llm.generate([ids], SamplingParams(temperature=0, max_tokens=1,
                                                truncate_prompt_tokens=5),
                          use_tqdm=False, tokenization_kwargs={"truncation_side": "right"})
    assert own.prompt_token_ids == ids[:5]
    chat = [{"role": "user", "content": "one two three four five six seven"}]
    (full,) = llm.chat(chat, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    (cut,) = llm.chat(chat, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False,
                      tokenization_kwargs={"truncate_prompt_tokens": 4,
                                           "truncation_side": "right"})
    assert cut.prompt_token_ids == full.prompt_token_ids[:4]
    with pytest.raises(ValueError, match="truncation_side"):
        llm.generate([ids], params, use_tqdm=False,
                     tokenization_kwargs={"truncate_prompt_tokens": 4, "truncation_side": "up"})
    with pytest.raises(ValueError, match="max_length"):  # not silently dropped
        llm.generate([ids], params, use_tqdm=False, tokenization_kwargs={"max_length": 4})


def test_bad_words_of_several_tokens_as_vllm_bans_them(llm):
    """A word of two tokens: its second token is banned right after its first (vLLM's rule),
    so the greedy output keeps everything before the word and never writes it."""
    tok = llm.get_tokenizer()
    ids = list(_greedy(llm, "The capital of France is").token_ids)
    for i in range(len(ids) - 1):
        pair = ids[i:i + 2]
        text = tok.decode(pair).lstrip()
        plain = tok.encode(text, add_special_tokens=False)
        spaced = tok.encode(" " + text, add_special_tokens=False)
        variants = [plain] + ([spaced] if spaced[0] != plain[0] and len(spaced) == len(plain)
                              else [])
        if pair in variants and len(plain) == 2 and pair not in [ids[j:j + 2] for j in range(i)]:
            break
    else:
        pytest.skip("no output pair tokenizes back to itself")
    banned = list(_greedy(llm, "The capital of France is", bad_words=[text]).token_ids)
    assert banned[:i + 1] == ids[:i + 1] and banned[i + 1] != ids[i + 1]
    assert all(banned[j:j + 2] not in variants for j in range(len(banned) - 1))
