"""vLLM's token-id response extras, shared by the completions and chat renderers.

return_token_ids: each choice carries `token_ids` (its generated ids; in a stream, each
chunk's new ids) and the prompt's ids as `prompt_token_ids` (completions: on the choice; chat:
on the response, or in a stream on each choice's first chunk). Ids the stream holds back with
their text (a possible stop string) ride on the choice's next chunk, so every id is sent once,
in order.

return_tokens_as_token_ids: logprobs name tokens as "token_id:<id>" (sampled and
alternatives), for tokens whose text is not valid UTF-8 on its own or is ambiguous.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cadence.engine.wire import TokenLogprob


def token_id_text(token_id: int) -> str:
    return f"token_id:{token_id}"


def logprobs_as_token_ids(entries: Iterable[TokenLogprob]) -> list[TokenLogprob]:
    """The entries with every token text replaced by its "token_id:<id>" name."""
    return [TokenLogprob(token_id=e.token_id, logprob=e.logprob, top_logprobs=e.top_logprobs,
                         token=token_id_text(e.token_id),
                         top_tokens=tuple(token_id_text(tid) for tid, _ in e.top_logprobs))
            for e in entries]


class PendingTokenIds:
    """Generated ids per choice not yet sent in a stream chunk."""

    def __init__(self) -> None:
        self._ids: dict[int, list[int]] = {}

    def add(self, index: int, token_ids: Sequence[int]) -> None:
        self._ids.setdefault(index, []).extend(int(t) for t in token_ids)

    def take(self, index: int) -> list[int]:
        return self._ids.pop(index, [])
