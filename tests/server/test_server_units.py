"""Pure pieces of the server, no sockets: errors, SSE, CLI flags, wire messages, metrics."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from cadence.core.config import SchedulerConfig
from cadence.core.plan import SampledToken
from cadence.core.sampling_params import SamplingParams
from cadence.engine.outputs import RequestOutput
from cadence.engine.engine_process import EngineProcessConfig
from cadence.engine.wire import (
    AbortRequests,
    AddRequest,
    EngineBatch,
    WireError,
    TokenLogprob,
    decode_message,
    encode_message,
    output_from_wire,
    output_to_wire,
    sampling_from_wire,
    sampling_to_wire,
)
from cadence.server.cli_serve import add_serve_arguments, configs_from_args, parse_size
from cadence.server.errors import validation_error_to_api_error
from cadence.server.protocol import ChatCompletionRequest, CompletionRequest
from cadence.server.sse import DONE_EVENT, sse_event
from cadence.telemetry.prometheus import PrometheusMetrics


def test_sse_event_is_openai_framing():
    assert sse_event({"a": "é"}) == 'data: {"a":"é"}\n\n'
    assert DONE_EVENT == "data: [DONE]\n\n"


def test_pydantic_errors_map_to_openai_400():
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate({"prompt": "x", "max_tokens": "3"})
    err = validation_error_to_api_error(info.value.errors())
    body = err.body()["error"]
    assert err.status == 400 and body["param"] == "max_tokens"
    assert body["type"] == "invalid_request_error"
    missing = validation_error_to_api_error(
        [{"type": "missing", "loc": ("body", "prompt"), "msg": "Field required"}])
    assert missing.code == "missing_required_parameter" and missing.param == "prompt"


def test_strict_types():
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"prompt": "x", "temperature": "0.5"})
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"prompt": "x", "ignore_eos": 1})
    ok = CompletionRequest.model_validate({"prompt": [1, 2], "temperature": 1})
    assert ok.temperature == 1.0
    chat = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
         "max_completion_tokens": 7})
    assert chat.effective_max_tokens() == 7


@pytest.mark.parametrize("text,value", [("2GiB", 2 * 2**30), ("512MiB", 512 * 2**20),
                                        ("1.5GB", 1_500_000_000), ("1000", 1000)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "2 parsecs", "-1GiB", "0"])
def test_parse_size_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def _parse(*argv: str):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser, parser.parse_args(argv)


def test_cli_flags_come_from_config_metadata():
    parser, _ = _parse()
    help_text = parser.format_help()
    # Help and choices are the dataclasses' field metadata.
    policies = next(f for f in dataclasses.fields(SchedulerConfig) if f.name == "policy")
    assert "stall-free" in help_text
    assert "{" + ",".join(policies.metadata["choices"]) + "}" in help_text
    assert "--no-enable-prefix-caching" in help_text and "{fcfs,priority}" in help_text
    _, args = _parse("--policy", "eager", "--max-num-batched-tokens", "256", "--kv-cache-memory",
                     "1GiB", "--no-enable-prefix-caching", "--scheduling-policy", "priority",
                     "--num-kv-blocks", "100", "--max-num-queued-requests", "5",
                     "--trace", "/tmp/t.jsonl", "--api-key", "k")
    server, process = configs_from_args(args)
    engine = process.engine_config
    assert engine["scheduler"]["policy"] == "eager"
    assert engine["scheduler"]["max_num_batched_tokens"] == 256
    assert engine["scheduler"]["scheduling"] == "priority"
    assert engine["cache"] == {"block_size": 16, "num_blocks": 100,
                               "kv_cache_memory_bytes": 2**30, "kv_cache_memory_fraction": None,
                               "enable_prefix_caching": False,
                               "num_swap_blocks": 0, "kv_offload_dir": None,
                               "kv_offload_disk_blocks": 1024,
                               "kv_offload_prefix_spill": True}
    assert engine["trace_path"] == "/tmp/t.jsonl"
    assert server.api_key == "k" and process.limits.max_num_queued_requests == 5
    # Unset flags keep the dataclass defaults.
    assert engine["scheduler"]["max_num_seqs"] == 64
    # The slo policy's knobs are on serve too (vLLM's names where vLLM has the concept).
    _, args = _parse("--target-itl-ms", "250", "--max-prefill-slowdown", "1.3",
                     "--max-num-partial-prefills", "4", "--max-long-partial-prefills", "1",
                     "--long-prefill-token-threshold", "256", "--no-startup-profile",
                     "--num-swap-blocks", "512", "--kv-offload-dir", "/tmp/kv",
                     "--kv-offload-disk-blocks", "64", "--no-kv-offload-prefix-spill")
    _, process = configs_from_args(args)
    sched = process.engine_config["scheduler"]
    assert (sched["policy"], sched["target_itl_ms"], sched["max_prefill_slowdown"]) == (
        "adaptive", 250.0, 1.3)
    assert (sched["max_num_partial_prefills"], sched["max_long_partial_prefills"],
            sched["long_prefill_token_threshold"]) == (4, 1, 256)
    assert process.engine_config["startup_profile"] is False
    assert process.engine_config["cache"]["num_swap_blocks"] == 512
    cache = process.engine_config["cache"]
    assert (cache["kv_offload_dir"], cache["kv_offload_disk_blocks"],
            cache["kv_offload_prefix_spill"]) == ("/tmp/kv", 64, False)


def test_cli_rejects_bad_values():
    parser, _ = _parse()
    with pytest.raises(SystemExit):
        parser.parse_args(["--policy", "lazy"])
    _, args = _parse("--max-num-seqs", "0")
    with pytest.raises(ValueError, match="max_num_seqs"):
        configs_from_args(args)


def test_wire_messages_round_trip_as_json():
    params = SamplingParams(max_tokens=5, temperature=0.5, stop=("x", "y"), seed=3)
    wire = sampling_to_wire(params)
    json.dumps(wire)  # plain data only
    assert sampling_from_wire(json.loads(json.dumps(wire))) == params
    msg = AddRequest(req_id="r1", sampling=wire, prompt_token_ids=[1, 2, 3], priority=2)
    assert decode_message(encode_message(msg)) == msg
    abort = AbortRequests(req_ids=["a", "b"])
    assert decode_message(encode_message(abort)) == abort
    batch = EngineBatch(outputs=[{"req_id": "r1"}], iteration=[1, 3, 0])
    assert decode_message(encode_message(batch)) == batch
    cfg = EngineProcessConfig(engine_config={"model": None}, engine_threads=2)
    assert EngineProcessConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(WireError):
        decode_message(b'{"type": "pickle"}')
    with pytest.raises(WireError):
        decode_message(b"not json")
    with pytest.raises(ValueError):
        sampling_from_wire({"max_tokens": 3, "evil": 1})


def test_outputs_cross_the_wire_as_the_engines_request_output():
    sampled = SampledToken(token_id=7, logprob=-0.5, top_logprobs=((7, -0.5), (9, -1.25)))
    out = RequestOutput("r1", (7,), "g", True, "length", 3, 1, 2, logprobs=(sampled,))
    wire = json.loads(json.dumps(output_to_wire(out, lambda t: f"<{t}>")))  # plain data only
    back = output_from_wire(wire)
    assert isinstance(back, RequestOutput)
    assert back == RequestOutput("r1", (7,), "g", True, "length", 3, 1, 2, logprobs=(
        TokenLogprob(token_id=7, logprob=-0.5, top_logprobs=((7, -0.5), (9, -1.25)),
                     token="<7>", top_tokens=("<7>", "<9>")),))
    entry = back.logprobs[0]
    assert isinstance(entry, SampledToken) and entry.token == "<7>"
    assert entry.top == (("<7>", 7, -0.5), ("<9>", 9, -1.25))
    failed = output_from_wire(output_to_wire(
        RequestOutput("r2", (), "", True, "error", 3, 0, 0, error="pool too small"), str))
    assert failed.logprobs is None and failed.error == "pool too small"


def test_prometheus_metrics_parse_and_count():
    m = PrometheusMetrics("m")
    other = PrometheusMetrics("m")  # own registry each: no clash, no global state
    m.update_engine_stats({"num_running": 2, "num_waiting": 1, "num_blocks_total": 10,
                           "num_blocks_used": 4, "num_blocks_free": 6, "num_blocks_cached": 1,
                           "num_preemptions_total": 3, "prefix_cache_queries": 100,
                           "prefix_cache_hits": 40})
    m.record_request({"finish_reason": "stop", "num_prompt_tokens": 7, "num_output_tokens": 3,
                      "ttft": 0.1, "e2e": 0.3, "tpot": 0.1, "queue_time": 0.01,
                      "prefill_time": 0.09, "decode_time": 0.2, "itl": [0.1, 0.1]})
    m.record_request({"finish_reason": "abort", "num_prompt_tokens": 5, "num_output_tokens": 0,
                      "ttft": None, "e2e": 0.05, "tpot": None, "queue_time": None,
                      "prefill_time": None, "decode_time": None, "itl": []})
    m.record_iteration(1, 12, 2)
    m.record_generated_tokens(3)
    samples = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            samples[(s.name, s.labels.get("finished_reason"))] = s.value
    assert samples[("cadence:kv_cache_usage_perc", None)] == 0.4
    assert samples[("cadence:num_requests_running", None)] == 2
    assert samples[("cadence:num_preemptions_total", None)] == 3
    assert samples[("cadence:prefix_cache_hits_total", None)] == 40
    assert samples[("cadence:request_success_total", "stop")] == 1
    assert samples[("cadence:request_success_total", "abort")] == 1
    assert samples[("cadence:prompt_tokens_total", None)] == 7  # the abort never prefilled
    assert samples[("cadence:generation_tokens_total", None)] == 3
    assert samples[("cadence:inter_token_latency_seconds_count", None)] == 2
    assert samples[("cadence:time_to_first_token_seconds_count", None)] == 1
    assert samples[("cadence:e2e_request_latency_seconds_count", None)] == 2
    assert samples[("cadence:iteration_prefill_tokens_total", None)] == 12
    other_samples = [s.name for fam in text_string_to_metric_families(other.render().decode())
                     for s in fam.samples]
    assert "cadence:request_success_total" not in other_samples


def test_front_end_never_imports_torch():
    # The front end must stay a thin asyncio process: the engine process owns torch.
    import subprocess
    import sys

    code = ("import sys, cadence.cli, cadence.server.launcher, cadence.server.app; "
            "cadence.cli.build_parser(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_usage_field_is_null_on_chunks_when_usage_requested():
    from cadence.server import response_format as fmt

    plain = fmt.chat_chunk("id", 1, "m", {"content": "x"}, None)
    with_usage = fmt.chat_chunk("id", 1, "m", {"content": "x"}, None, usage_field=True)
    assert "usage" not in plain and with_usage["usage"] is None
    final = fmt.usage_chunk("id", 1, "m", "text_completion", fmt.usage_dict(3, 2))
    assert final["choices"] == [] and final["usage"]["total_tokens"] == 5
