"""A request's output text as it streams: incremental detokenizing, then stop strings."""

from __future__ import annotations

from collections.abc import Sequence

from cadence.core.sampling_params import SamplingParams
from cadence.engine.stop_strings import StopStringMatcher
from cadence.model.detokenizer import IncrementalDetokenizer
from cadence.model.tokenizer import Tokenizer


class RequestText:
    """Turns each step's new token ids into the text the client may see now.

    Without a tokenizer (token-ids-only engines in tests) the text is always empty and stop
    strings are refused up front.
    """

    def __init__(self, tokenizer: Tokenizer | None, params: SamplingParams) -> None:
        if tokenizer is None and params.stop:
            raise ValueError("stop strings need a tokenizer; this engine has none")
        # detokenize=False (vLLM's): token ids only, the text stays empty.
        self._detok = (IncrementalDetokenizer(tokenizer, params.skip_special_tokens)
                       if tokenizer is not None and params.detokenize else None)
        self._matcher = StopStringMatcher(params.stop, params.include_stop_str_in_output)
        self.stop_token_ids = frozenset(params.stop_token_ids)
        self.eos_token_ids = frozenset(params.eos_token_ids)
        # vLLM: a stop_token_ids token that ends the request leaves its text out of the output
        # unless include_stop_str_in_output; EOS is a special token and decodes to nothing.
        self._include_stop = params.include_stop_str_in_output
        # vLLM checks no stop condition before min_tokens: stop strings in the first
        # min_tokens tokens' text are plain text (emitted, never held back, never matched).
        self._min_tokens = params.min_tokens
        self._num_tokens = 0

    @property
    def stopped(self) -> bool:
        """A stop string matched: the request must finish with reason "stop"."""
        return self._matcher.stopped

    @property
    def matched_stop(self) -> str | None:
        """The stop string that ended the request, if one did."""
        return self._matcher.matched

    def push(self, token_ids: Sequence[int], finished: bool, stop_token: bool = False) -> str:
        """Text completed by these tokens; `finished` releases everything still held back.
        `stop_token`: the last token is the stop_token_ids entry that ended the request."""
        if self._detok is None:
            return ""
        pieces = []
        last = len(token_ids) - 1
        for i, token_id in enumerate(token_ids):
            if self._matcher.stopped:
                break
            self._num_tokens += 1
            if i == last and stop_token and not self._include_stop:
                break  # the stop token's text is not output
            piece = self._detok.push(token_id)
            if self._num_tokens <= self._min_tokens:
                pieces.append(piece)  # before min_tokens nothing is fed, so nothing is held
            else:
                pieces.append(self._matcher.feed(piece))
        if finished and not self._matcher.stopped:
            pieces.append(self._matcher.feed(self._detok.flush()))
            pieces.append(self._matcher.flush())
        return "".join(pieces)
