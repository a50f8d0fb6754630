"""llama.cpp's SentencePiece-style ("llama" GGUF vocabulary) tokenizer, ported line by line to
Python as the reference for gguf_spm (llama-vocab.cpp: tokenizer_st_partition, then
llm_tokenizer_spm_session::tokenize / try_add_bigram / resegment per text fragment)."""

from __future__ import annotations

import heapq

CONTROL, USER_DEFINED, UNKNOWN = 3, 4, 2


def _partition(text: str, tokens: list[str], types: list[int]) -> list[tuple[str, object]]:
    """Special / user-defined / unknown tokens matched in the raw text, longest first."""
    fragments: list[tuple[str, object]] = [("text", text)]
    specials = sorted((i for i, kind in enumerate(types) if kind in (CONTROL, USER_DEFINED, UNKNOWN)),
                      key=lambda i: -len(tokens[i].encode()))
    for special in specials:
        piece = tokens[special]
        out = []
        for kind, value in fragments:
            if kind != "text":
                out.append((kind, value))
                continue
            while (pos := value.find(piece)) >= 0:
                if pos:
                    out.append(("text", value[:pos]))
                out.append(("token", special))
                value = value[pos + len(piece):]
            if value:
                out.append(("text", value))
        fragments = out
    return fragments


def _session(text: str, vocab: dict[str, int], scores: list[float]) -> list[int]:
    chars = list(text)
    symbols = [[c, i - 1, i + 1 if i + 1 < len(chars) else -1] for i, c in enumerate(chars)]
    queue: list[tuple[float, int, int, int]] = []

    def try_add_bigram(left: int, right: int) -> None:
        if left == -1 or right == -1:
            return
        merged = symbols[left][0] + symbols[right][0]
        token = vocab.get(merged)
        if token is None:
            return
        # llama.cpp's queue: highest score first, then the leftmost pair.
        heapq.heappush(queue, (-scores[token], left, right, len(merged)))

    for i in range(1, len(symbols)):
        try_add_bigram(i - 1, i)
    while queue:
        _, left, right, size = heapq.heappop(queue)
        left_sym, right_sym = symbols[left], symbols[right]
        if not left_sym[0] or not right_sym[0] or len(left_sym[0]) + len(right_sym[0]) != size:
            continue  # stale: one side was merged since
        left_sym[0] += right_sym[0]
        right_sym[0] = ""
        left_sym[2] = right_sym[2]
        if right_sym[2] != -1:
            symbols[right_sym[2]][1] = left
        try_add_bigram(left_sym[1], left)
        try_add_bigram(left, left_sym[2])
    out = []
    i = 0 if symbols else -1
    while i != -1:
        piece = symbols[i][0]
        if piece in vocab:
            out.append(vocab[piece])
        else:  # bytes of what never formed a token
            out.extend(vocab[f"<0x{b:02X}>"] for b in piece.encode())
        i = symbols[i][2]
    return out


def llama_cpp_spm_encode(text: str, tokens: list[str], scores: list[float], types: list[int],
                         add_space_prefix: bool, bos_id: int | None) -> list[int]:
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    out = [] if bos_id is None else [bos_id]
    prev_special = True
    for kind, value in _partition(text, tokens, types):
        if kind == "token":
            out.append(value)
            prev_special = True
            continue
        piece = (" " if add_space_prefix and prev_special else "") + value
        out.extend(_session(piece.replace(" ", "\u2581"), vocab, scores))
        prev_special = False
    return out
