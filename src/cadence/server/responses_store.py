"""Responses kept in memory for previous_response_id (and GET /v1/responses/{id}), as vLLM
keeps them: bounded, oldest first out, lost on restart.

Each entry holds the conversation a follow-up continues (the stored request's input messages,
after any history of its own, then its output as assistant turns; not its instructions, which
OpenAI does not carry over) and the response object as it was answered.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

# At most this many responses, and this many characters of their conversations together
# (a conversation can be as long as the context; this bounds the server's memory).
MAX_STORED_RESPONSES = 1024
MAX_STORED_CHARS = 32 * 1024 * 1024


@dataclass(frozen=True)
class StoredResponse:
    messages: list[dict[str, Any]]  # chat messages: the conversation up to this response
    response: dict[str, Any]  # the response object answered
    num_chars: int


class ResponseStore:
    def __init__(self, max_responses: int = MAX_STORED_RESPONSES,
                 max_chars: int = MAX_STORED_CHARS) -> None:
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._max_responses = max_responses
        self._max_chars = max_chars
        self._chars = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, messages: list[dict[str, Any]],
            response: dict[str, Any]) -> None:
        size = len(json.dumps(messages, ensure_ascii=False))
        if size > self._max_chars:
            return  # larger than the whole store: not kept (a follow-up gets a 404)
        old = self._entries.pop(response_id, None)
        if old is not None:
            self._chars -= old.num_chars
        self._entries[response_id] = StoredResponse(messages, response, size)
        self._chars += size
        while len(self._entries) > self._max_responses or self._chars > self._max_chars:
            _, evicted = self._entries.popitem(last=False)
            self._chars -= evicted.num_chars

    def get(self, response_id: str) -> StoredResponse | None:
        return self._entries.get(response_id)
