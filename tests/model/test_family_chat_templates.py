"""Each family's chat template (test copies of the published ones, tests/model/chat_templates)
renders in cadence's sandbox to the prompt format the family documents, including the
constructs they use (raise_exception, strftime_now, namespace, tojson, loop controls, content
as a list of parts) and chat_template_kwargs such as Qwen3's enable_thinking, in-process, in
the worker pool and through LLM.chat."""

from __future__ import annotations

import json
import os
from datetime import datetime

import pytest

from cadence.engine.chat_render import render_chat
from cadence.model.chat_template import ChatTemplate

HERE = os.path.join(os.path.dirname(__file__), "chat_templates")
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & 'here'",
                                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
# (bos, eos) each family's tokenizer passes.
SPECIALS = {"llama3": ("<|begin_of_text|>", "<|eot_id|>"), "qwen2_5": (None, "<|im_end|>"),
            "qwen3": (None, "<|im_end|>"), "gemma2": ("<bos>", "<eos>"), "gemma3": ("<bos>", "<eos>"),
            "phi3": ("<s>", "<|endoftext|>"), "phi4": (None, "<|im_end|>"), "mistral": ("<s>", "</s>"),
            "smollm3": (None, "<|im_end|>")}


def template(family: str) -> ChatTemplate:
    with open(os.path.join(HERE, f"{family}.jinja"), encoding="utf-8") as f:
        return ChatTemplate(f.read(), *SPECIALS[family])


def test_llama3_system_date_and_tools():
    got = template("llama3").render(CHAT, date_string="26 Jul 2024")
    assert got == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                   "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
                   "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n")
    # strftime_now when no date is given; tools as indented JSON (transformers' tojson: no HTML escapes).
    got = template("llama3").render(CHAT, tools=[TOOL])
    assert f"Today Date: {datetime.now().strftime('%d %b %Y')}\n" in got
    assert "Environment: ipython\n" in got and json.dumps(TOOL, indent=4) + "\n\nHi there<|eot_id|>" in got
    with pytest.raises(ValueError, match="single tool-calls"):
        template("llama3").render([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
            {"function": {"name": "a", "arguments": {}}}, {"function": {"name": "b", "arguments": {}}}]}])


def test_qwen2_5_default_system_and_tool_round_trip():
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "18C"}]
    got = template("qwen2_5").render(messages)
    assert got == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                   "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
                   '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                   "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n"
                   "<|im_start|>assistant\n")
    assert "\n" + json.dumps(TOOL) + "\n</tools>" in template("qwen2_5").render(CHAT, tools=[TOOL])


def test_qwen3_enable_thinking_and_reasoning_history():
    one = [{"role": "user", "content": "Hi"}]
    assert template("qwen3").render(one) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert template("qwen3").render(one, enable_thinking=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    history = [{"role": "user", "content": "2+2?"},
               {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
               {"role": "user", "content": "3+3?"}]
    # Reasoning of turns before the last query is dropped (namespace over messages[::-1]).
    assert template("qwen3").render(history) == (
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n")


def test_gemma_turns_parts_and_role_checks():
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": " Hello "}]},
                {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "Bye"}]
    assert template("gemma3").render(messages) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHello<end_of_turn>\n<start_of_turn>model\nHi!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    assert template("gemma2").render(messages[1:2] and [{"role": "user", "content": "Hi"}]) == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n")
    with pytest.raises(ValueError, match="roles must alternate"):
        template("gemma3").render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    with pytest.raises(ValueError, match="System role not supported"):
        template("gemma2").render(CHAT)


def test_phi_and_mistral_formats():
    assert template("phi3").render(CHAT) == "<|system|>\nBe brief.<|end|>\n<|user|>\nHi there<|end|>\n<|assistant|>\n"
    assert template("phi3").render(CHAT, add_generation_prompt=False).endswith("<|end|>\n<|endoftext|>")
    assert template("phi4").render(CHAT) == (
        "<|im_start|>system<|im_sep|>Be brief.<|im_end|><|im_start|>user<|im_sep|>Hi there<|im_end|>"
        "<|im_start|>assistant<|im_sep|>")
    turns = [CHAT[0], {"role": "user", "content": "Hi"}, {"role": "assistant", "content": " Hello "},
             {"role": "user", "content": "Bye"}]
    assert template("mistral").render(turns) == "<s>[INST] Hi[/INST] Hello</s>[INST] Be brief.\n\nBye[/INST]"
    with pytest.raises(ValueError, match="must alternate"):
        template("mistral").render([{"role": "assistant", "content": "x"}])


def test_smollm3_reasoning_mode_from_kwargs_and_system_flag():
    today = datetime.now().strftime("%d %B %Y")
    head = ("<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\n"
            f"Today Date: {today}\n")
    got = template("smollm3").render([{"role": "user", "content": "Hi"}], enable_thinking=False)
    assert got == (head + "Reasoning Mode: /no_think\n\n## Custom Instructions\n\n"
                   "You are a helpful AI assistant named SmolLM, trained by Hugging Face.\n\n<|im_end|>\n"
                   "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n")
    flagged = template("smollm3").render([{"role": "system", "content": "Be terse. /no_think"},
                                          {"role": "user", "content": "Hi"}])
    assert "Reasoning Mode: /no_think\n\n## Custom Instructions\n\nBe terse.\n\n<|im_end|>" in flagged
    assert "Reasoning Mode: /think" in template("smollm3").render([{"role": "user", "content": "Hi"}])


def test_template_kwargs_cannot_replace_the_renderers_variables():
    with pytest.raises(ValueError, match="cannot set bos_token, messages"):
        render_chat(None, CHAT, "x", True, False, template_kwargs={"messages": [], "bos_token": "x"})
    with pytest.raises(ValueError, match="map variable names"):
        render_chat(None, CHAT, "x", True, False, template_kwargs=["enable_thinking"])


def test_kwargs_reach_the_worker_pool_and_llm_chat(tiny_llama_dir):
    from cadence.engine.llm import LLM
    from cadence.engine.template_pool import TemplatePool
    from cadence.core.sampling_params import SamplingParams

    with open(os.path.join(HERE, "qwen3.jinja"), encoding="utf-8") as f:
        source = f.read()
    one = [{"role": "user", "content": "Hi"}]
    expected = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    pool = TemplatePool(min_workers=1, max_workers=1)
    try:
        assert pool.render(source, None, "<|im_end|>", one, True, enable_thinking=False) == expected
    finally:
        pool.close()
    llm = LLM(model=tiny_llama_dir, dtype="float32")
    (out,) = llm.chat(one, SamplingParams(max_tokens=1), use_tqdm=False, chat_template=source,
                      chat_template_kwargs={"enable_thinking": False})
    assert out.prompt == expected


def test_hf_folder_template_from_chat_template_json(tiny_llama_dir, tmp_path):
    """Processor-style repos (Gemma 3) keep the template in chat_template.json only."""
    import shutil

    from cadence.model.tokenizer import Tokenizer

    folder = tmp_path / "gemma_like"
    shutil.copytree(tiny_llama_dir, folder)
    config_file = folder / "tokenizer_config.json"
    cfg = json.loads(config_file.read_text())
    cfg.pop("chat_template")
    config_file.write_text(json.dumps(cfg))
    with open(os.path.join(HERE, "gemma3.jinja"), encoding="utf-8") as f:
        source = f.read()
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": source}))
    tok = Tokenizer.from_hf_dir(str(folder))
    assert tok.chat_template == source
    assert tok.apply_chat_template([{"role": "user", "content": "Hi"}]) == (
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n")


def test_generation_blocks_render_their_body():
    """Training-style templates wrap assistant turns in transformers' {% generation %} tag."""
    source = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}"
              "<a>{{ m['content'] }}</a>{% endgeneration %}{% else %}<u>{{ m['content'] }}</u>"
              "{% endif %}{% endfor %}")
    got = ChatTemplate(source, None, None).render(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}], False)
    assert got == "<u>q</u><a>r</a>"
