"""`cadence serve` serves each model family over the OpenAI API with the family's chat template.

Each family is a tiny random checkpoint (tests/model/family_checkpoints.py) with the family's
published chat template (a test copy in tests/model/chat_templates) in its tokenizer_config.json;
Qwen3 is also served from a GGUF file written as llama.cpp's converter writes it, template in
its metadata. A chat request answers with text, and its prompt token count is that of the
family's template rendered locally: the server used that template.

A server start is mostly one core's waiting (two interpreters, imports, a model load): each
family's server is started while the family before it is tested (family_servers), so the nine
starts overlap in pairs on a 2-core host instead of queuing one after another.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import openai
import pytest
from server_harness import RunningServer, openai_client, start_server, tiny_model_args

from cadence.model.chat_template import ChatTemplate
from cadence.model.tokenizer import Tokenizer

TEMPLATES = os.path.join(os.path.dirname(__file__), "..", "model", "chat_templates")
# family checkpoint -> its chat template file
FAMILIES = {"llama3": "llama3", "qwen3": "qwen3", "gemma3": "gemma3", "gemma2": "gemma2", "phi3": "phi3",
            "mistral_window": "mistral", "smollm3": "smollm3",
            # Mixture of experts: one family (the server path does not depend on the MLP kind).
            "qwen3_moe": "qwen3"}
# No system turn: Gemma 2's and Mistral's templates refuse one; they need user/assistant turns.
MESSAGES = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi."},
            {"role": "user", "content": "How are you?"}]


def _with_template(model_dir: str, family: str) -> str:
    with open(os.path.join(TEMPLATES, f"{FAMILIES[family]}.jinja"), encoding="utf-8") as f:
        text = f.read()
    path = os.path.join(model_dir, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["chat_template"] = text
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    return text


def _prompt_tokens(model_dir: str, template: str) -> int:
    tokenizer = Tokenizer.from_hf_dir(model_dir)
    rendered = ChatTemplate(template, tokenizer.bos_token, tokenizer.eos_token).render(
        MESSAGES, add_generation_prompt=True)
    return len(tokenizer.encode(rendered, add_special_tokens=False))


def _chat(server, model: str) -> openai.types.chat.ChatCompletion:
    client = openai_client(server)
    return client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6, temperature=0)


class FamilyServers:
    """Each family's checkpoint (its template in tokenizer_config.json) and server; the next
    family this session runs is started in the background while the current one is tested, so
    at most two servers are up at once."""

    def __init__(self, root: str, order: list[str]) -> None:
        self.root, self.order = root, order
        self.pool = ThreadPoolExecutor(max_workers=2)
        self.started: dict[str, Future] = {}
        self.models: dict[str, tuple[str, str]] = {}  # family -> (model dir, template)

    def _start(self, family: str) -> None:
        from tests.model.family_checkpoints import build_family_checkpoint

        os.makedirs(os.path.join(self.root, family))
        # Built in the test's thread (seeded torch); only the server's start runs in the pool.
        model_dir = build_family_checkpoint(os.path.join(self.root, family), family)
        self.models[family] = (model_dir, _with_template(model_dir, family))
        self.started[family] = self.pool.submit(start_server, self.root, *tiny_model_args(model_dir))

    def take(self, family: str) -> tuple[RunningServer, str, str]:
        """(server, model dir, template) of `family`; the caller stops the server."""
        if family not in self.started:
            self._start(family)
        later = self.order[self.order.index(family) + 1:] if family in self.order else []
        if later and later[0] not in self.models:
            self._start(later[0])
        return (self.started.pop(family).result(), *self.models[family])

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        for future in self.started.values():  # started ahead for a family that did not run
            if future.exception() is None:
                future.result().stop()


@pytest.fixture(scope="module")
def family_servers(request, tmp_path_factory) -> Iterator[FamilyServers]:
    # The families in the order this session runs them (a -k selection runs fewer).
    order = [item.callspec.params["family"] for item in request.session.items
             if item.module is request.module and hasattr(item, "callspec")
             and "family" in item.callspec.params]
    servers = FamilyServers(str(tmp_path_factory.mktemp("families")), order)
    yield servers
    servers.close()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_served_with_its_chat_template(family, family_servers):
    server, model_dir, template = family_servers.take(family)
    try:
        model = openai_client(server).models.list().data[0].id
        reply = _chat(server, model)
        assert reply.choices[0].finish_reason in ("length", "stop")
        assert reply.usage.completion_tokens >= 1
        assert reply.usage.prompt_tokens == _prompt_tokens(model_dir, template)
    finally:
        server.stop()


def test_gguf_file_served_with_its_metadata_template(tmp_path):
    import gguf

    from tests.model.family_checkpoints import build_family_checkpoint
    from tests.model.gguf_helpers import write_tiny_gguf

    os.makedirs(tmp_path / "qwen3")
    model_dir = build_family_checkpoint(str(tmp_path / "qwen3"), "qwen3")
    template = _with_template(model_dir, "qwen3")
    plain = write_tiny_gguf(model_dir, str(tmp_path / "plain.gguf"))
    # The same file with tokenizer.chat_template in its metadata, as the converter writes it.
    reader = gguf.GGUFReader(plain)
    path = str(tmp_path / "qwen3.gguf")
    writer = gguf.GGUFWriter(path, "qwen3")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_array(field.name, value)
        else:
            writer.add_key_value(field.name, value, vtype)
    writer.add_chat_template(template)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    shutil.rmtree(model_dir)  # nothing but the GGUF file is served
    server = start_server(str(tmp_path), *tiny_model_args(path))
    try:
        model = openai_client(server).models.list().data[0].id
        reply = _chat(server, model)
        assert reply.usage.completion_tokens >= 1
        from cadence.model.gguf_tokenizer import tokenizer_from_gguf

        tokenizer = tokenizer_from_gguf(gguf.GGUFReader(path))
        rendered = ChatTemplate(template, tokenizer.bos_token, tokenizer.eos_token).render(
            MESSAGES, add_generation_prompt=True)
        assert reply.usage.prompt_tokens == len(tokenizer.encode(rendered, add_special_tokens=False))
    finally:
        server.stop()
