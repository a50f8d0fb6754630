"""Multi-turn conversations for the fleet simulator (sim/fleet.py), in tokens.

A conversation opens with one of a few shared system prompts; each turn adds new tokens (the
user's message, on the first turn also a per-conversation document, plus the chat template's
markers) to the whole chat so far, answers included, and is sent a think time
(sim/think_time.py: exponential by default, or constant or uniform) after the previous answer
ended: turn k's prompt = turn k-1's prompt + its answer + new tokens.

Two sources: `synthetic(...)` (explore fleets on paper) and `from_replica_bench(row)`, the
conversations a `benchmarks/replica_bench.py` run measured (per turn: prompt and output tokens,
think time, the system prompt's tokens), so the simulation replays what the replicas served.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from cadence.sim.think_time import ThinkTime


@dataclass(frozen=True)
class Turn:
    new_tokens: int  # prompt tokens after the previous turn's prompt and answer
    output_tokens: int
    think_s: float  # from this turn's answer to the next turn


@dataclass(frozen=True)
class Conversation:
    conv_id: int
    start_s: float
    system: int  # which shared system prompt opens it
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class ConversationWorkload:
    conversations: tuple[Conversation, ...]
    system_tokens: dict[int, int]  # system prompt index -> its tokens
    seed: int = 0

    @property
    def num_requests(self) -> int:
        return sum(len(c.turns) for c in self.conversations)


def synthetic(num_conversations: int = 16, rate: float = 0.5, num_systems: int = 3,
              system_tokens: int = 50, doc_tokens: int = 450, user_tokens: int = 30,
              output_tokens: int = 32, min_turns: int = 4, max_turns: int = 8,
              think_mean_s: float = 0.3, seed: int = 0,
              think_dist: str = "exponential", think_spread: float = 0.25
              ) -> ConversationWorkload:
    """Poisson conversation starts at `rate` per second, `min_turns`-`max_turns` turns
    (uniform); the first turn carries a `doc_tokens` document of its own; think times drawn
    from `think_dist` with mean `think_mean_s` (ThinkTime)."""
    rng = random.Random(seed)
    think = ThinkTime(think_dist, think_mean_s, think_spread)
    conversations, t = [], 0.0
    for c in range(num_conversations):
        t += rng.expovariate(rate)
        system = rng.randrange(num_systems)
        n = rng.randint(min_turns, max_turns)
        turns = tuple(Turn((doc_tokens if k == 0 else 0) + user_tokens, output_tokens,
                           think.draw(rng))
                      for k in range(n))
        conversations.append(Conversation(c, t, system, turns))
    return ConversationWorkload(tuple(conversations),
                                {i: system_tokens for i in range(num_systems)}, seed)


def from_replica_bench(row: dict[str, Any], seed: int = 0) -> ConversationWorkload:
    """The conversations of one replica_bench.py result row (its per-request records)."""
    system_tokens = {int(k): int(v) for k, v in row["system_tokens"].items()}
    by_conv: dict[int, list[dict]] = {}
    for rec in row["records"]:
        by_conv.setdefault(int(rec["conversation"]), []).append(rec)
    conversations = []
    for conv_id, recs in sorted(by_conv.items()):
        recs.sort(key=lambda r: r["turn"])
        system = int(recs[0]["system"])
        turns, before = [], system_tokens[system]
        for rec in recs:
            prompt, output = int(rec["prompt_tokens"]), max(1, int(rec["output_tokens"]))
            turns.append(Turn(max(1, prompt - before), output, float(rec["think"])))
            before = prompt + output
        conversations.append(Conversation(conv_id, float(recs[0]["sent"]), system,
                                          tuple(turns)))
    return ConversationWorkload(tuple(conversations), system_tokens, seed)


def system_token_ids(workload: ConversationWorkload, system: int,
                     vocab_size: int) -> list[int]:
    rng = random.Random(f"{workload.seed}:system:{system}")
    return [rng.randrange(3, vocab_size) for _ in range(workload.system_tokens[system])]


def new_token_ids(workload: ConversationWorkload, conv_id: int, turn: int, n: int,
                  vocab_size: int) -> list[int]:
    """A turn's new tokens: random ids of its own (no other conversation shares them)."""
    rng = random.Random(f"{workload.seed}:{conv_id}:{turn}")
    return [rng.randrange(3, vocab_size) for _ in range(n)]
