"""Workload generation: seeded, distinct, exact lengths with a tokenizer, stated when approximate."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from cadence.bench.config import WorkloadConfig
from cadence.bench.token_counter import ApproxCounter, TokenizerCounter, TokenizerLoadError, load_token_counter
from cadence.bench.workloads import build_workload

WORKLOADS = ("chat", "rag", "coding", "doc-burst", "mix")


@dataclass(frozen=True)
class PieceTokenizer:
    """A deterministic stand-in for BPE: a BOS, then up to 3 letters (with the space before
    them) per token, so word counts and token counts differ and are not additive at word ends."""

    def encode(self, text: str) -> list[int]:
        pieces = re.findall(r"\s?\w{1,3}|\s?[^\w\s]|\s+", text)
        return [1] + [hash(p) % 1000 + 2 for p in pieces]


@pytest.fixture
def counter():
    return TokenizerCounter(PieceTokenizer(), source="test piece tokenizer")


def small(name: str, **kw) -> WorkloadConfig:
    base = dict(name=name, num_requests=12, short_tokens=(8, 40), long_tokens=300, output_tokens=(4, 12),
                num_streams=3, num_docs=2)
    base.update(kw)
    return WorkloadConfig(**base)


@pytest.mark.parametrize("name", WORKLOADS)
def test_exact_lengths_with_a_tokenizer(name, counter):
    w = build_workload(small(name), counter)
    assert w.tokens_exact and w.token_source == "test piece tokenizer"
    for r in w.requests:
        assert counter.count(r.prompt) == r.prompt_tokens
        assert 4 <= r.max_tokens <= 12 or r.kind == "document"


@pytest.mark.parametrize("name", WORKLOADS)
def test_same_seed_same_requests_other_seed_other_requests(name, counter):
    a = build_workload(small(name), counter)
    b = build_workload(small(name), counter)
    c = build_workload(small(name, seed=1), counter)
    assert a.requests == b.requests
    assert [r.prompt for r in a.requests] != [r.prompt for r in c.requests]


@pytest.mark.parametrize("name", WORKLOADS)
def test_prompts_are_distinct(name, counter):
    w = build_workload(small(name, num_requests=30), counter)
    assert len({r.prompt for r in w.requests}) == len(w.requests)


def test_chat_lengths_in_range(counter):
    w = build_workload(small("chat", num_requests=40), counter)
    lengths = [r.prompt_tokens for r in w.requests]
    assert min(lengths) >= 8 and max(lengths) <= 40 and len(set(lengths)) > 5


def test_rag_requests_share_their_context_prefix(counter):
    w = build_workload(small("rag", num_contexts=2), counter)
    by_ctx = {}
    for r in w.requests:
        head = r.prompt.split("\n\nQuestion:")[0]
        by_ctx.setdefault(r.context_id, set()).add(head)
    assert sorted(by_ctx) == [0, 1]
    assert all(len(heads) == 1 for heads in by_ctx.values())  # one shared context each
    assert by_ctx[0] != by_ctx[1]
    assert all(r.prompt_tokens > 300 for r in w.requests)


def test_coding_context_looks_like_code(counter):
    w = build_workload(small("coding"), counter)
    assert "def " in w.requests[0].prompt and "return" in w.requests[0].prompt


def test_doc_burst_streams_then_documents(counter):
    w = build_workload(small("doc-burst", doc_output_tokens=3), counter)
    kinds = [(r.kind, r.phase) for r in w.requests]
    assert kinds == [("stream", 0)] * 3 + [("document", 1)] * 2
    docs = [r for r in w.requests if r.kind == "document"]
    assert all(r.prompt_tokens == 300 and r.max_tokens == 3 for r in docs)
    assert w.default_arrival == "script"
    assert all(r.prompt_tokens < w.long_prompt_tokens <= 300 for r in w.requests if r.kind == "stream")


def test_mix_has_a_long_tail(counter):
    w = build_workload(small("mix", num_requests=200, long_tokens=400), counter)
    lengths = sorted(r.prompt_tokens for r in w.requests)
    median = lengths[len(lengths) // 2]
    assert lengths[0] >= 8 and lengths[-1] <= 400
    assert lengths[-1] > 5 * median  # the tail reaches far beyond the typical prompt
    assert sum(n >= w.long_prompt_tokens for n in lengths) >= 1


def test_approximate_lengths_are_stated():
    w = build_workload(small("chat"), ApproxCounter(source="approximate: test"))
    assert not w.tokens_exact and w.token_source.startswith("approximate")
    disabled = load_token_counter(None, use_tokenizer=False)
    assert not disabled.exact and "disabled" in disabled.source


def test_bad_sizes_and_paths_raise_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown workload"):
        WorkloadConfig(name="chitchat")
    with pytest.raises(ValueError, match="MIN:MAX"):
        WorkloadConfig(short_tokens=(50, 10))
    with pytest.raises(TokenizerLoadError, match="does not exist"):
        load_token_counter(str(tmp_path / "missing.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file")
    with pytest.raises(TokenizerLoadError, match="could not load"):
        load_token_counter(str(bad))
