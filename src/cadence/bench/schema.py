"""The versioned JSON schema of a benchmark result and of a sweep result.

Bump SCHEMA_VERSION when a field changes meaning or disappears; adding fields keeps it.
"""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION = "cadence.bench/1"
SWEEP_SCHEMA_VERSION = "cadence.sweep/1"

_num = {"type": "number"}
_num_or_null = {"type": ["number", "null"]}
_int = {"type": "integer", "minimum": 0}

STATS = {
    "type": "object",
    "required": ["count", "mean", "min", "p50", "p95", "p99", "max"],
    "properties": {"count": _int, **{k: _num_or_null for k in ("mean", "min", "p50", "p95", "p99", "max")}},
}

FAILURE = {
    "type": ["object", "null"],
    "required": ["kind", "message", "http_status"],
    "properties": {
        "kind": {"enum": ["http", "server_error", "stream_cut", "timeout", "connect", "finish_reason", "client"]},
        "message": {"type": "string"},
        "http_status": {"type": ["integer", "null"]},
    },
}

RECORD = {
    "type": "object",
    "required": [
        "index", "kind", "prompt_tokens", "max_tokens", "prompt_sha1", "send_time", "end_time",
        "chunk_times", "chunk_tokens", "status", "failure", "finish_reason",
        "usage_prompt_tokens", "usage_completion_tokens", "counted_by_logprobs",
    ],
    "properties": {
        "index": _int,
        "kind": {"type": "string"},
        "prompt_tokens": _int,
        "max_tokens": {"type": "integer", "minimum": 1},
        "prompt_sha1": {"type": "string", "pattern": "^[0-9a-f]{40}$"},
        "send_time": _num,
        "end_time": _num_or_null,
        "chunk_times": {"type": "array", "items": _num},
        "chunk_tokens": {"type": "array", "items": {"type": "integer", "minimum": 1}},
        "status": {"enum": ["ok", "failed"]},
        "failure": FAILURE,
        "finish_reason": {"type": ["string", "null"]},
        "usage_prompt_tokens": {"type": ["integer", "null"]},
        "usage_completion_tokens": {"type": ["integer", "null"]},
        "counted_by_logprobs": {"type": "boolean"},
    },
}

METRICS = {
    "type": "object",
    "required": [
        "requests", "throughput", "ttft", "itl", "tpot", "e2e", "ttft_by_bucket", "interference",
        "goodput", "failures", "token_counting",
    ],
    "properties": {
        "ttft": STATS,
        "itl": STATS,
        "tpot": STATS,
        "e2e": STATS,
        "throughput": {
            "type": "object",
            "required": ["duration_s", "completed", "request_rps", "output_tokens", "output_tps"],
        },
        "ttft_by_bucket": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["bucket", "lo", "hi", "ttft"],
                "properties": {"ttft": STATS, "lo": _int, "hi": {"type": ["integer", "null"]}},
            },
        },
        "interference": {
            "type": "object",
            "required": [
                "long_prompt_tokens", "windows", "interfered_requests", "itl_interfered", "itl_other",
                "itl_in_windows", "ttft_long", "ttft_short",
            ],
            "properties": {
                k: STATS for k in ("itl_interfered", "itl_other", "itl_in_windows", "ttft_long", "ttft_short")
            },
        },
        "goodput": {"type": "object", "required": ["slo", "good_requests", "goodput_rps", "fraction"]},
        "failures": {"type": "object", "required": ["count", "by_kind", "requests"]},
        "token_counting": {"type": "object", "required": ["rule", "chunks", "multi_token_chunks"]},
    },
}

RUN = {
    "type": "object",
    "required": ["label", "arrival", "duration_s", "metrics", "records", "server_metrics", "timeline"],
    "properties": {
        "label": {"type": "string"},
        "arrival": {"type": "object", "required": ["kind"]},
        "duration_s": _num,
        "metrics": METRICS,
        "records": {"type": "array", "items": RECORD},
        "server_metrics": {
            "type": "object",
            "required": ["available", "samples"],
            "properties": {
                "available": {"type": "boolean"},
                "samples": {"type": "array", "items": {"type": "object", "required": ["t"]}},
            },
        },
        "timeline": {
            "type": "object",
            "required": ["windows", "requests"],
            "properties": {
                "windows": {"type": "array", "items": {"type": "object", "required": ["index", "start", "end", "preemptions"]}},
                "requests": {"type": "array", "items": {"type": "object", "required": ["index", "at_send", "at_first_token"]}},
            },
        },
    },
}

RESULT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "cadence bench result",
    "type": "object",
    "required": ["schema_version", "kind", "created_at", "config", "environment", "workload", "runs"],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "kind": {"const": "bench"},
        "created_at": {"type": "string"},
        "config": {"type": "object", "required": ["client", "workload", "arrival", "analysis"]},
        "environment": {"type": "object", "required": ["python", "host", "cpu_count", "packages"]},
        "server": {"type": "object"},
        "workload": {
            "type": "object",
            "required": ["name", "num_requests", "tokens_exact", "token_source", "long_prompt_tokens"],
        },
        "runs": {"type": "array", "minItems": 1, "items": RUN},
    },
}

SWEEP_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "cadence sweep result",
    "type": "object",
    "required": ["schema_version", "kind", "created_at", "config", "environment", "settings", "pareto", "choice"],
    "properties": {
        "schema_version": {"const": SWEEP_SCHEMA_VERSION},
        "kind": {"const": "sweep"},
        "settings": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "policy", "max_num_batched_tokens", "long_prefill_token_threshold", "status"],
                "properties": {"status": {"enum": ["ok", "failed"]}},
            },
        },
        "pareto": {"type": "array", "items": {"type": "string"}},
        "choice": {"type": ["object", "null"]},
    },
}


class ResultSchemaError(ValueError):
    """A result does not match its schema; the message lists every problem found."""


def _validate(result: Any, schema: dict[str, Any]) -> None:
    try:
        import jsonschema
    except ImportError as exc:  # jsonschema is a dev dependency
        raise ResultSchemaError("jsonschema is not installed; pip install jsonschema") from exc
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(result), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors[:20]]
        more = f"\n... and {len(errors) - 20} more" if len(errors) > 20 else ""
        raise ResultSchemaError("result does not match its schema:\n" + "\n".join(lines) + more)


def validate_result(result: Any) -> None:
    """Raise ResultSchemaError unless `result` is a valid bench result (RESULT_SCHEMA)."""
    _validate(result, RESULT_SCHEMA)


def validate_sweep(result: Any) -> None:
    """Raise ResultSchemaError unless `result` is a valid sweep result (SWEEP_SCHEMA)."""
    _validate(result, SWEEP_SCHEMA)
