"""Server test fixtures: a real `cadence serve` subprocess on a free localhost port.

One server per module (module-scoped fixtures): starting one costs an interpreter, the engine
process and a model load. Most modules use the tiny random Llama (tests/conftest.py); the
messaging/limits modules use the fake engine in server_fake_engine.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from server_harness import RunningServer, start_server, tiny_model_args


@pytest.fixture(scope="module")
def tiny_server(tiny_llama_dir, tmp_path_factory) -> Iterator[RunningServer]:
    """`cadence serve` on the tiny random Llama; one per test module."""
    server = start_server(str(tmp_path_factory.mktemp("server")), *tiny_model_args(tiny_llama_dir))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_llama_dir):
    from cadence.model.tokenizer import Tokenizer

    return Tokenizer.from_hf_dir(tiny_llama_dir)
