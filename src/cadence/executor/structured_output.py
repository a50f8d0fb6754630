"""Structured output: grammar token masks from llguidance, one matcher per constrained request.

    spec (json schema | json_object | regex | choice | lark)  --grammar_for-->  llguidance grammar
    matcher per request: fed the request's output tokens lazily (the tokens it has not seen
    yet, read from chunk.history), asked for the bitmask of allowed next tokens, which the
    sampler applies (logits of disallowed tokens -> -inf) before any sampling or argmax.

Lazy feeding keeps this stateless towards the scheduler: preemption keeps output tokens, so a
recomputed request's matcher is still in sync; a finished request's matcher is dropped by
`release`.

Compiling is the part that grows with the grammar (a{10000}{10000} builds its lexer for
seconds): `prepare` does it at admission, in the engine's admission threads (llguidance
releases the GIL), building the request's matcher and its first mask under a time budget
(MAX_COMPILE_SECONDS, past it a 400); the step loop then starts from that matcher and mask, so
a step only pays llguidance's per-token work, itself bounded by its lexer fuel. A matcher that
fails later (its lexer past llguidance's limits) or that the model could not finish ends the
request through EOS, and `unfinished` tells the engine to say "length", never "stop": the
output does not match the grammar. llguidance was chosen over xgrammar because its wheel has no dependencies (xgrammar
requires torch and triton, which would fight the pinned CPU torch).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cadence.core.plan import ScheduledChunk
from cadence.core.sampling_params import StructuredOutputsParams


class StructuredOutputError(ValueError):
    """A grammar that does not compile: the client's request is at fault (a 400)."""

    code = "invalid_structured_output"


# JSON is written compactly with OpenAI's separators: a model cannot pad it with whitespace
# until max_tokens cuts it (a schema's own "x-guidance" options still win).
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

# Seconds a grammar's compilation (its matcher and first mask) may take at admission.
MAX_COMPILE_SECONDS = 2.0
# Prepared matchers whose request never reached the step loop (refused later, aborted while
# queued) are dropped after this long.
PREPARED_TTL_S = 120.0
# Compiled grammars kept (matcher at its start state and first mask): requests repeating a
# grammar, at once or later, copy it instead of compiling it again.
MAX_COMPILED_GRAMMARS = 64


def grammar_for(spec: StructuredOutputsParams) -> str:
    """The llguidance grammar text of a structured-output spec."""
    import llguidance

    build = llguidance.LLMatcher
    kind = spec.kind
    if kind == "json":
        return build.grammar_from_json_schema(spec.json, defaults=JSON_OPTIONS)
    if kind == "json_object":
        return build.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if kind == "regex":
        return build.grammar_from_regex(spec.regex)
    if kind == "choice":
        alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.choice)
        return build.grammar_from_lark(f"start: {alternatives}")
    return build.grammar_from_lark(spec.grammar)


@dataclass
class _Matcher:
    matcher: Any  # llguidance.LLMatcher
    num_consumed: int = 0
    # The bitmask row of the first step (int32 [ceil(V / 32)]), computed at admission.
    first_mask: Any = None
    prepared_at: float = 0.0


@dataclass
class _Compiled:
    """One grammar compiled at its start state, shared by the requests that use it."""

    done: threading.Event
    matcher: Any = None  # llguidance.LLMatcher, never advanced (requests get deep copies)
    first_mask: Any = None  # int32 [ceil(V / 32)]
    elapsed_s: float = 0.0
    error: str | None = None


class StructuredOutputs:
    """Grammar state of every constrained request of one executor."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._ll_tokenizer = None  # built on first use (about 2 s for a 49k vocabulary)
        self._matchers: dict[str, _Matcher] = {}
        # Matchers compiled at admission (admission threads), taken by the step loop.
        self._prepared: dict[str, _Matcher] = {}
        # Each grammar's text, by the spec's JSON (requests often repeat one schema).
        self._grammars: dict[str, str] = {}
        self._compiled: dict[str, _Compiled] = {}
        self._init_lock = threading.Lock()
        self._compiled_lock = threading.Lock()

    def _tokenizer_for_llg(self):
        with self._init_lock:  # admission threads may ask at once
            if self._ll_tokenizer is None:
                import llguidance

                tok = self._tokenizer
                eos = list(tok.stop_token_ids) or [tok.eos_token_id]
                self._ll_tokenizer = llguidance.LLTokenizer(
                    tok.backend.to_str(), n_vocab=self.vocab_size, eos_token=eos)
        return self._ll_tokenizer

    def _grammar(self, spec: StructuredOutputsParams) -> str:
        key = json.dumps(spec.to_dict(), sort_keys=True)
        grammar = self._grammars.get(key)
        if grammar is None:
            grammar = grammar_for(spec)
            self._grammars[key] = grammar
        return grammar

    def check(self, spec: StructuredOutputsParams) -> None:
        """ValueError naming the problem when the spec cannot be compiled (a 400 upstream)."""
        import llguidance

        try:
            grammar = self._grammar(spec)
        except (ValueError, TypeError) as exc:
            raise StructuredOutputError(f"invalid structured output {spec.kind}: {exc}") from None
        error = llguidance.LLMatcher.validate_grammar(grammar, self._tokenizer_for_llg())
        if error and not error.startswith("WARNING"):
            raise StructuredOutputError(f"invalid structured output {spec.kind}: {error}")

    def prepare(self, req_id: str, spec: StructuredOutputsParams,
                budget_s: float = MAX_COMPILE_SECONDS) -> None:
        """Compile the request's grammar now (off the step loop): its matcher and first mask,
        kept for the request's first step. StructuredOutputError when it does not compile or
        took longer than `budget_s` (decided once per grammar: a repeat is refused at once)."""
        compiled = self._compile(spec)
        if compiled.error is not None:
            raise StructuredOutputError(compiled.error)
        if compiled.elapsed_s > budget_s:
            raise StructuredOutputError(
                f"the structured output {spec.kind} took {compiled.elapsed_s:.1f}s to compile, "
                f"past its budget of {budget_s:g}s")
        with self._compiled_lock:
            matcher = compiled.matcher.deep_copy()
        now = time.monotonic()
        for old_id, old in list(self._prepared.items()):
            if now - old.prepared_at > PREPARED_TTL_S:
                self._prepared.pop(old_id, None)
        self._prepared[req_id] = _Matcher(matcher, first_mask=compiled.first_mask,
                                          prepared_at=now)

    def _compile(self, spec: StructuredOutputsParams) -> _Compiled:
        """The grammar at its start state; one thread compiles, concurrent asks wait for it."""
        key = json.dumps(spec.to_dict(), sort_keys=True)
        with self._compiled_lock:
            compiled = self._compiled.get(key)
            owner = compiled is None
            if owner:
                if len(self._compiled) >= MAX_COMPILED_GRAMMARS:
                    self._compiled.pop(next(iter(self._compiled)))
                compiled = self._compiled[key] = _Compiled(threading.Event())
        if not owner:
            compiled.done.wait()
            return compiled
        try:
            import llguidance
            from llguidance.torch import allocate_token_bitmask, fill_next_token_bitmask

            self.check(spec)
            start = time.monotonic()
            matcher = llguidance.LLMatcher(self._tokenizer_for_llg(), self._grammar(spec),
                                           log_level=0)
            bitmask = allocate_token_bitmask(1, self.vocab_size)
            fill_next_token_bitmask(matcher, bitmask, 0)  # releases the GIL
            compiled.elapsed_s = time.monotonic() - start
            if matcher.is_error():
                compiled.error = (f"invalid structured output {spec.kind}: "
                                  f"{matcher.get_error().splitlines()[0]}")
            compiled.matcher, compiled.first_mask = matcher, bitmask[0].clone()
        except StructuredOutputError as exc:
            compiled.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - waiters must never hang on a bug here
            compiled.error = f"invalid structured output {spec.kind}: {exc}"
        finally:
            compiled.done.set()
        return compiled

    def unfinished(self, req_id: str) -> bool:
        """Whether the request's grammar is not complete (or its matcher failed): an EOS now
        was forced by the mask, not allowed by the grammar."""
        state = self._matchers.get(req_id)
        if state is None:
            return False
        return state.matcher.is_error() or not state.matcher.is_accepting()

    def masks(self, chunks: Sequence[ScheduledChunk]) -> dict[int, torch.Tensor]:
        """row -> bool [V] allowed next tokens, for the constrained rows among `chunks`."""
        rows = [i for i, c in enumerate(chunks) if c.sampling.structured_outputs is not None]
        if not rows:
            return {}
        from llguidance.torch import allocate_token_bitmask, fill_next_token_bitmask

        bitmask = allocate_token_bitmask(len(rows), self.vocab_size)  # [R, ceil(V / 32)] int32
        for j, i in enumerate(rows):
            state = self._sync(chunks[i])
            if state.first_mask is not None and state.num_consumed == 0:
                bitmask[j] = state.first_mask  # computed at admission
                continue
            state.first_mask = None
            fill_next_token_bitmask(state.matcher, bitmask, j)
        # bits -> bool [R, V]: bit b of int32 word w is token 32 w + b (little-endian bytes).
        # numpy's unpackbits: ~0.2 ms for 4 rows of 49k tokens, where a broadcast shift in
        # torch took 1-70 ms (threaded elementwise ops on busy cores).
        bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")
        bits = bits[:, : self.vocab_size]
        allowed = torch.from_numpy(bits.view(np.bool_))
        any_allowed = bits.any(axis=1).tolist()  # numpy: torch reductions stall on busy cores
        eos = self._tokenizer_for_llg().eos_tokens
        out = {}
        for j, i in enumerate(rows):
            row = allowed[j]
            if not any_allowed[j]:
                # A matcher in error (should not happen: sampled tokens come from its own
                # mask): end the request rather than sample garbage.
                row = torch.zeros_like(row)
                row[eos] = True
            out[i] = row
        return out

    def _sync(self, chunk: ScheduledChunk) -> _Matcher:
        import llguidance

        state = self._matchers.get(chunk.req_id)
        if state is None:
            state = self._prepared.pop(chunk.req_id, None)
            if state is None:  # not prepared (offline use): compiled here
                grammar = self._grammar(chunk.sampling.structured_outputs)
                state = _Matcher(llguidance.LLMatcher(self._tokenizer_for_llg(), grammar,
                                                      log_level=0))
            self._matchers[chunk.req_id] = state
        history = chunk.history or ()
        new = list(history[chunk.num_prompt_tokens + state.num_consumed:])
        if new:
            state.matcher.consume_tokens(new)
            state.num_consumed += len(new)
        return state

    def release(self, req_id: str) -> None:
        self._matchers.pop(req_id, None)
        self._prepared.pop(req_id, None)
