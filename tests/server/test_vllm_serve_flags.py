"""`cadence serve` started the way vLLM is: vLLM's flags, several served names, CORS, and the
model path as the name clients send."""

from __future__ import annotations

import httpx
import pytest

from server_harness import start_server, tiny_model_args


@pytest.fixture(scope="module")
def vllm_style_server(tiny_llama_dir, tmp_path_factory):
    # Without --num-kv-blocks: the KV pool is sized by --gpu-memory-utilization.
    args = tiny_model_args(tiny_llama_dir)
    at = args.index("--num-kv-blocks")
    server = start_server(
        str(tmp_path_factory.mktemp("server")), *args[:at], *args[at + 2:],
        "--tensor-parallel-size", "1", "--trust-remote-code", "--enforce-eager",
        "--gpu-memory-utilization", "0.5", "--disable-log-requests", "--swap-space", "4",
        "--max-logprobs", "20", "--served-model-name", "tiny", "tiny-alias",
        "--allowed-origins", '["https://app.example"]')
    yield server
    server.stop()


def test_vllm_flags_start_and_warn_in_one_line_each(vllm_style_server):
    log = vllm_style_server.log()
    lines = [ln for ln in log.splitlines() if "gpu-memory-utilization" in ln]
    assert len(lines) == 1 and "KV pool" in lines[0]
    assert "KV pool from kv_cache_memory_fraction 0.5" in log  # applied, not only warned
    assert "Traceback" not in log


def test_several_served_names(vllm_style_server):
    base = vllm_style_server.base_url
    ids = [m["id"] for m in httpx.get(base + "/v1/models").json()["data"]]
    assert ids == ["tiny", "tiny-alias"]
    for name in ids:
        r = httpx.post(base + "/v1/completions", json={"model": name, "prompt": "Hi",
                                                       "max_tokens": 2}, timeout=60)
        assert r.status_code == 200 and r.json()["model"] == "tiny"
    r = httpx.post(base + "/v1/completions", json={"model": "other", "prompt": "Hi"})
    assert r.status_code == 404


def test_cors_preflight_and_headers(vllm_style_server):
    base = vllm_style_server.base_url
    pre = httpx.options(base + "/v1/completions", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert pre.status_code == 200
    assert pre.headers["access-control-allow-origin"] == "https://app.example"
    got = httpx.get(base + "/v1/models", headers={"Origin": "https://app.example"})
    assert got.headers["access-control-allow-origin"] == "https://app.example"
    other = httpx.get(base + "/v1/models", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers


def test_first_start_says_what_it_is_doing(vllm_style_server):
    """Issue 32: the kernel load (a compile on a first run) and the startup profile each print
    a progress line instead of sitting silent."""
    log = vllm_style_server.log()
    assert "CPU kernels: loading" in log, log
    assert "startup profile: timing model steps" in log, log
