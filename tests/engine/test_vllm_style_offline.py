"""vLLM-style offline code runs unchanged on cadence (only the import line differs).

Everything below is spelled as vLLM's documentation spells it: LLM(model=..., ...),
SamplingParams(...), llm.generate(prompts, sampling_params=..., use_tqdm=...), RequestOutput
.outputs[i] (CompletionOutput: text, token_ids, finish_reason, stop_reason, logprobs),
.prompt / .prompt_token_ids, {"prompt_token_ids": [...]} prompts, llm.chat(...),
llm.get_tokenizer(). The tiny random Llama keeps it fast.
"""

from __future__ import annotations

import pytest

from cadence import LLM, SamplingParams
from cadence.core.sampling_params import StructuredOutputsParams


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(model=tiny_llama_dir, dtype="float32", seed=0, max_model_len=256,
               trust_remote_code=True, tensor_parallel_size=1,
               enable_prefix_caching=True, enable_chunked_prefill=True,
               max_num_batched_tokens=64, max_num_seqs=8)


def test_quickstart(llm):
    prompts = ["Hello, my name is", "The president of the United States is",
               "The capital of France is", "The future of AI is"]
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=8)
    outputs = llm.generate(prompts, sampling_params)
    assert len(outputs) == len(prompts)
    for output, prompt in zip(outputs, prompts):
        assert output.prompt == prompt
        generated_text = output.outputs[0].text
        assert isinstance(generated_text, str)
        assert len(output.outputs[0].token_ids) == 8
        assert output.outputs[0].finish_reason == "length"
        assert output.prompt_token_ids == llm.get_tokenizer().encode(prompt)
        assert output.timeline is not None  # cadence's extra field


def test_token_id_prompts_keyword_params_and_no_tqdm(llm):
    tokenizer = llm.get_tokenizer()
    ids = tokenizer.encode("The sky is")
    greedy = SamplingParams(temperature=0, max_tokens=6)
    (by_ids,) = llm.generate({"prompt_token_ids": ids}, sampling_params=greedy, use_tqdm=False)
    (by_text,) = llm.generate("The sky is", sampling_params=greedy, use_tqdm=False)
    assert by_ids.prompt_token_ids == ids
    assert by_ids.outputs[0].token_ids == by_text.outputs[0].token_ids
    (by_dict,) = llm.generate([{"prompt": "The sky is"}], greedy, use_tqdm=False)
    assert by_dict.outputs[0].text == by_text.outputs[0].text


def test_stop_as_one_string_is_one_stop_string(llm):
    """The bug: stop=" 6" was split into the characters " " and "6"."""
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    (full,) = llm.generate("Count: 1, 2, 3,", greedy, use_tqdm=False)
    text = full.outputs[0].text
    # A stop string from the middle of the greedy text, at least 2 characters long.
    stop = next(text[i:i + 3] for i in range(2, len(text) - 3) if text[i:i + 3].strip())
    cut = text.index(stop)
    (out,) = llm.generate("Count: 1, 2, 3,", SamplingParams(
        temperature=0, max_tokens=24, ignore_eos=True, stop=stop), use_tqdm=False)
    assert out.outputs[0].text == text[:cut]
    assert out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].stop_reason == stop
    (kept,) = llm.generate("Count: 1, 2, 3,", SamplingParams(
        temperature=0, max_tokens=24, ignore_eos=True, stop=[stop],
        include_stop_str_in_output=True), use_tqdm=False)
    assert kept.outputs[0].text == text[:cut + len(stop)]


def test_n_completions_share_the_prompt_blocks(llm):
    prompt = "The quick brown fox jumps over the lazy dog. " * 4  # several full KV blocks
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=5, logprobs=2)
    (out,) = llm.generate(prompt, params, use_tqdm=False)
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({c.token_ids for c in out.outputs}) > 1  # seed + index: different draws
    for c in out.outputs:
        assert len(c.logprobs) == len(c.token_ids) == 5
        assert all(tok in entry for tok, entry in zip(c.token_ids, c.logprobs))
        assert c.cumulative_logprob == pytest.approx(
            sum(entry[tok].logprob for tok, entry in zip(c.token_ids, c.logprobs)))
    # Completions 1 and 2 found completion 0's prompt blocks in the prefix cache.
    cached = [c.timeline.num_cached_tokens for c in out.outputs]
    assert cached[0] == 0 or cached[0] < cached[1]
    assert cached[1] > 0 and cached[2] > 0


def test_chat_and_tokenizer(llm):
    messages = [{"role": "system", "content": "You are brief."},
                {"role": "user", "content": "Hello"}]
    outputs = llm.chat(messages, sampling_params=SamplingParams(temperature=0, max_tokens=4),
                       use_tqdm=False)
    prompt = llm.get_tokenizer().apply_chat_template(messages, tokenize=False,
                                                     add_generation_prompt=True)
    assert outputs[0].prompt == prompt
    assert len(outputs[0].outputs[0].token_ids) <= 4
    # continue_final_message: the assistant's partial reply is continued, not closed.
    partial = messages + [{"role": "assistant", "content": "Sure"}]
    (cont,) = llm.chat(partial, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False,
                       add_generation_prompt=False, continue_final_message=True)
    assert cont.prompt.endswith("Sure")


def test_penalties_bias_and_min_tokens(llm):
    tokenizer = llm.get_tokenizer()
    eos = tokenizer.eos_token_id
    base = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    (plain,) = llm.generate("Hello world", base, use_tqdm=False)
    first = plain.outputs[0].token_ids[0]
    # logit_bias -100 on the greedy first token: another token comes first.
    (biased,) = llm.generate("Hello world", SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True, logit_bias={first: -100}), use_tqdm=False)
    assert biased.outputs[0].token_ids[0] != first
    # +100 on EOS, min_tokens=3: EOS is masked for 3 tokens, then wins at once.
    (held,) = llm.generate("Hello world", SamplingParams(
        temperature=0, max_tokens=12, logit_bias={eos: 100}, min_tokens=3), use_tqdm=False)
    assert len(held.outputs[0].token_ids) == 4 and held.outputs[0].token_ids[-1] == eos
    # A strong frequency penalty forbids repeats that greedy decoding makes.
    (penalized,) = llm.generate("Hello world", SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True, frequency_penalty=2.0,
        repetition_penalty=2.0), use_tqdm=False)
    toks = penalized.outputs[0].token_ids
    assert len(set(toks)) >= len(set(plain.outputs[0].token_ids))


def test_structured_outputs_choice(llm):
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=8,
                            structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    outs = llm.generate(["Is it?", "Really?", "Sure?"], params, use_tqdm=False)
    assert all(o.outputs[0].text in ("yes", "no") for o in outs)
