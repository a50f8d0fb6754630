"""Server test fixtures: a real `cadence serve` subprocess on a free localhost port.

Starting a server costs an interpreter, the engine process, a model load and the startup
profile (seconds each on a 2-core CI host), so the plain tiny-Llama server is started once per
session and shared by every module that asks for it; a module that needs other flags starts a
server of its own (module-scoped). Most modules use the tiny random Llama (tests/conftest.py);
the messaging/limits modules use the fake engine in server_fake_engine.py. Tests on the shared
server leave it idle and compare counters before and after, never their absolute values.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from server_harness import RunningServer, openai_client, start_server, tiny_model_args


@pytest.fixture(scope="session")
def tiny_server(tiny_llama_dir, tmp_path_factory) -> Iterator[RunningServer]:
    """`cadence serve` on the tiny random Llama with the default flags; one per session."""
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
