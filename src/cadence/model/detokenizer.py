"""IncrementalDetokenizer: turn a stream of token ids into a stream of complete text pieces."""

from __future__ import annotations

from cadence.model.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Streams text for one sequence, never emitting half of a multi-byte UTF-8 character.

    A byte-level token can end in the middle of a character (an emoji spans up to 4 tokens), and
    some tokenizers decode a token differently depending on what precedes it (leading spaces).
    So each push decodes a short window: ids[prefix_offset:] against ids[prefix_offset:read_offset]
    and emits the difference, holding it back while it ends in U+FFFD (an unfinished character).
    The window restarts only at points where everything before it was emitted as whole text, so
    the concatenation of all pushes plus `flush()` equals `tokenizer.decode(all ids)`.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self.token_ids: list[int] = []
        self._prefix_offset = 0  # window start: ids before it are fully emitted
        self._read_offset = 0  # ids[prefix_offset:read_offset] are emitted, the rest pending
        self._prefix_text: str | None = ""  # text of ids[prefix_offset:read_offset], None: stale

    def _decode(self, start: int, end: int | None = None) -> str:
        # Every id was range-checked by push(): skip the tokenizer's per-id check.
        return self._tokenizer.decode_checked(self.token_ids[start:end], self._skip_special)

    def _window_prefix_text(self) -> str:
        """Text of the emitted part of the window; decoded once per window move, not per push
        (a held-back character would otherwise decode the same prefix again each token)."""
        if self._prefix_text is None:
            self._prefix_text = self._decode(self._prefix_offset, self._read_offset)
        return self._prefix_text

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (possibly empty)."""
        self.token_ids.append(self._tokenizer.check_id(token_id))
        prefix_text = self._window_prefix_text()
        full_text = self._decode(self._prefix_offset)
        if full_text.endswith(_REPLACEMENT) or len(full_text) <= len(prefix_text):
            # Unfinished character (or nothing visible yet): wait for the next token.
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self.token_ids)
        self._prefix_text = None
        return full_text[len(prefix_text):]

    def flush(self) -> str:
        """Emit whatever is still held back (at end of stream, e.g. a truncated character)."""
        prefix_text = self._window_prefix_text()
        full_text = self._decode(self._prefix_offset)
        self._prefix_offset = self._read_offset = len(self.token_ids)
        self._prefix_text = ""
        return full_text[len(prefix_text):]
