from __future__ import annotations

import dataclasses

import pytest

from cadence.core.config import CacheConfig, SchedulerConfig


@pytest.mark.parametrize("cls", [SchedulerConfig, CacheConfig])
def test_every_field_has_help_text(cls):
    for f in dataclasses.fields(cls):
        assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"


def test_defaults_match_the_interface_map():
    s = SchedulerConfig()
    assert (s.policy, s.max_num_batched_tokens, s.max_num_seqs) == ("adaptive", 2048, 64)
    assert s.core_split == "interleave"  # adaptive's split; other policies stay colocated
    # The budget's default follows the policy: chunks of other policies are sized by it.
    assert SchedulerConfig(policy="chunked").max_num_batched_tokens == 512
    assert SchedulerConfig(policy="eager", max_num_batched_tokens=64).max_num_batched_tokens == 64
    assert (s.max_prefill_slowdown, s.max_num_partial_prefills, s.max_long_partial_prefills) == (
        1.15, 4, 1)
    assert SchedulerConfig(policy="chunked").max_num_partial_prefills == 1  # vLLM's default
    assert s.max_stall_share == 0.2
    assert s.long_prompt_threshold == 8192 * 4 // 100
    assert (s.long_prefill_token_threshold, s.max_model_len, s.scheduling) == (0, 8192, "fcfs")
    c = CacheConfig()
    assert (c.block_size, c.num_blocks, c.kv_cache_memory_bytes, c.enable_prefix_caching) == (
        16,
        None,
        None,
        True,
    )


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SchedulerConfig().max_num_seqs = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"policy": "greedy"}, "policy"),
        ({"scheduling": "lifo"}, "scheduling"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_prefill_slowdown": 1.0}, "max_prefill_slowdown"),
        ({"max_stall_share": 1.0}, "max_stall_share"),
        ({"max_stall_share": -0.1}, "max_stall_share"),
        ({"max_num_partial_prefills": 0}, "max_num_partial_prefills"),
        ({"max_num_partial_prefills": 2, "max_long_partial_prefills": 3}, "max_long_partial"),
        ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_num_seqs": 2.5}, "must be an int"),
        ({"max_num_seqs": True}, "must be an int"),
    ],
)
def test_scheduler_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SchedulerConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"block_size": 0}, "block_size"),
        ({"num_blocks": 0}, "num_blocks"),
        ({"kv_cache_memory_bytes": -5}, "kv_cache_memory_bytes"),
        ({"enable_prefix_caching": "yes"}, "enable_prefix_caching"),
    ],
)
def test_cache_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CacheConfig(**kwargs)


def test_choices_are_listed_for_named_options():
    fields = {f.name: f for f in dataclasses.fields(SchedulerConfig)}
    assert fields["policy"].metadata["choices"] == ("eager", "chunked", "slo", "adaptive")
    assert fields["scheduling"].metadata["choices"] == ("fcfs", "priority")


def test_adaptive_policy_splits_cores_by_default_and_keeps_slo_defaults():
    adaptive = SchedulerConfig(policy="adaptive")
    assert adaptive.core_split == "interleave" and adaptive.models_step_time
    assert (adaptive.max_num_batched_tokens, adaptive.max_num_partial_prefills) == (2048, 4)
    # An explicit --core-split wins; other policies stay colocated unless asked.
    assert SchedulerConfig(policy="adaptive", core_split="off").core_split == "off"
    assert SchedulerConfig(policy="slo").core_split == "off"
    assert SchedulerConfig(policy="eager", core_split="disjoint").core_split == "disjoint"
    with pytest.raises(ValueError, match="core_split"):
        SchedulerConfig(core_split="half")
