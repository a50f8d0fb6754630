"""Seeded streams of text pieces: the raw material prompts are built from.

A piece is a word with its leading separator (" river", ".", "\n    return"), so that a prompt is
the concatenation of pieces and, for BPE tokenizers that split on spaces, its token count is close
to the sum of its pieces' counts. Each stream owns its own `random.Random`, so a prompt depends
only on (seed, purpose, index), never on what else was generated before it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from cadence.bench.vocabulary import CODE_IDENTIFIERS, CODE_TYPES, ENGLISH_WORDS


def seeded_rng(seed: int, *purpose: object) -> random.Random:
    """A generator for one purpose, e.g. seeded_rng(0, "chat", 17). String seeds are hashed with
    SHA-512 by `random`, so this is stable across processes and Python runs."""
    return random.Random(":".join([str(seed), *map(str, purpose)]))


def english_pieces(rng: random.Random) -> Iterator[str]:
    """Endless sentences of common words: " word" pieces with a "." every 6 to 16 words."""
    words_left = rng.randint(6, 16)
    while True:
        yield " " + rng.choice(ENGLISH_WORDS)
        words_left -= 1
        if words_left == 0:
            yield "."
            words_left = rng.randint(6, 16)


def code_pieces(rng: random.Random) -> Iterator[str]:
    """Endless Python-like source: small functions with typed arguments and arithmetic bodies."""
    while True:
        name = f"{rng.choice(CODE_IDENTIFIERS)}_{rng.choice(CODE_IDENTIFIERS)}"
        args = [rng.choice(CODE_IDENTIFIERS) for _ in range(rng.randint(1, 3))]
        yield "\ndef"
        yield f" {name}("
        for i, arg in enumerate(args):
            yield f"{', ' if i else ''}{arg}: {rng.choice(CODE_TYPES)}"
        yield "):"
        for _ in range(rng.randint(1, 3)):
            target = rng.choice(CODE_IDENTIFIERS)
            yield f"\n    {target}"
            yield f" = {rng.choice(args)}"
            yield f" + {rng.randint(0, 999)}"
        yield f"\n    return {rng.choice(args)}\n"
