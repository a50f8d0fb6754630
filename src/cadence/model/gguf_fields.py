"""Reading typed metadata values out of a GGUF file's key/value section."""

from __future__ import annotations

from typing import Any

import gguf

_MISSING = object()


def gguf_value(reader: gguf.GGUFReader, key: str, default: Any = _MISSING) -> Any:
    """The decoded value of metadata `key` (str, number, bool or list); KeyError if absent."""
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise KeyError(f"GGUF metadata has no {key!r}")
        return default
    return field.contents()
