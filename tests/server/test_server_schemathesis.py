"""schemathesis against the server's own OpenAPI document (issue 13), bounded examples.

Every generated request (valid and invalid bodies, every documented operation) must get no 5xx
and a response that matches the spec: documented status, content type, headers and schema.
Runs on the tiny random Llama, so the real tokenizer and chat template see the fuzzed text.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from server_harness import start_server, tiny_model_args

# Not checked: positive_data_acceptance (a body valid by the JSON schema must be 2xx). The
# server rightly answers 400 to schema-valid bodies that break rules a JSON schema cannot say:
# a prompt longer than the context, min_tokens over the resolved max_tokens, a feature cadence
# does not implement. Every other check runs: no 5xx, documented statuses, content types,
# headers and response schemas, and invalid bodies rejected.
# Endpoints that never end by design (live event streams) are not fuzzed.
EXCLUDED_PATHS = ("/dashboard/events",)
MAX_EXAMPLES = 25


@pytest.fixture(scope="module")
def fuzz_server(tiny_llama_dir, tmp_path_factory):
    server = start_server(str(tmp_path_factory.mktemp("fuzz")), *tiny_model_args(tiny_llama_dir))
    yield server
    server.stop()


def _operations(base_url: str) -> list:
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    ops = [result.ok() for result in schema.get_all_operations()]
    return [op for op in ops if op.path not in EXCLUDED_PATHS]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_api_matches_its_spec(fuzz_server, mode):
    ops = _operations(fuzz_server.base_url)
    assert {op.path for op in ops} >= {"/v1/completions", "/v1/chat/completions", "/v1/models",
                                      "/health", "/metrics"}
    failures: list[str] = []
    for op in ops:
        @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck), phases=[Phase.generate])
        @given(case=op.as_strategy(generation_mode=mode))
        def check(case):
            try:
                case.call_and_validate(base_url=fuzz_server.base_url, timeout=60,
                                       excluded_checks=[positive_data_acceptance])
            except Exception as exc:  # collect every operation's failures, report them together
                failures.append(f"{op.method.upper()} {op.path}: {exc}"[:2000])
                raise

        try:
            check()
        except Exception:
            pass
    assert not failures, "\n\n".join(failures[:5])
