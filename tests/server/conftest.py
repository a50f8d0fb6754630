"""Server test fixtures: a real `cadence serve` subprocess on a free localhost port.

One server per module (module-scoped fixtures): starting one costs an interpreter, the engine
process and a model load. Most modules use the tiny random Llama (tests/conftest.py); the
messaging/limits modules use the fake engine in server_fake_engine.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from server_harness import RunningServer, openai_client, start_server, tiny_model_args


@pytest.fixture(scope="module")
def tiny_server(tiny_llama_dir, tmp_path_factory) -> Iterator[RunningServer]:
    """`cadence serve` on the tiny random Llama; one per test module."""
    server = start_server(str(tmp_path_factory.mktemp("server")), *tiny_model_args(tiny_llama_dir))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(tiny_server):
    """The official `openai` client on this module's tiny_server. A module with a server of
    its own overrides `client` (the `model` fixture below then follows it)."""
    return openai_client(tiny_server)


@pytest.fixture(scope="module")
def model(client) -> str:
    """The served model's name, as clients ask for it."""
    return client.models.list().data[0].id


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_llama_dir):
    from cadence.model.tokenizer import Tokenizer

    return Tokenizer.from_hf_dir(tiny_llama_dir)
