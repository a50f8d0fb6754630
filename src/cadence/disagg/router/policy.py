"""Per request: serve it colocated on a decode worker, or prefill it on a prefill worker and
hand its KV over? `always` and `never` are there for comparison; `auto` weighs, in seconds:

    gain  = streams * P / prefill_rate
            (the stall a P-token prefill adds to each of the `streams` requests decoding on the
            decode worker if it ran there: the prefill/decode interference it avoids; streams
            = the more of the requests this router has in flight on that worker now and the
            number it measured in flight when requests arrive: a long prefill also stalls the
            requests that arrive while it runs)
    cost  = prefill_queue + P * kv_bytes_per_token / transfer_bandwidth + hop
            (what the handoff adds to this request: the prefill worker's backlog, each call
            there taking prefill_fixed + its tokens / prefill_rate, moving its KV, the extra
            HTTP hop)

and disaggregates when gain > cost. With no stream to protect colocated wins outright (no
handoff is cheaper than any handoff). Short prompts go through the same comparison: on a slow
CPU even a 30-token prefill stalls every stream longer than its handoff costs (measured here:
a fixed 64-token floor kept them colocated and the streams of a short/long mix stalled 4-10x
longer than with every request handed off); `min_disagg_prompt_tokens` can still set a floor.
The prefill worker's backlog counts a fixed cost per call (HTTP, scheduling, the first token)
besides its tokens, so that many short handoffs queued there make colocated win again.
Every term is measured while serving (`CostModel`): the prefill time of calls made to an idle
worker (fitted as fixed + per token), transfer bandwidth and bytes per token from the decode
workers' /metrics
counters, the hop from the round trip of those scrapes, tokens per character from usage, the
requests in flight seen at arrivals as a mean that forgets with a time constant (Poisson
arrivals see the time average: a steady stream of requests keeps it up, requests sent one at a
time keep it at 0). The router's own in-flight counts are used, not the workers' scraped
gauges, which lag by up to a scrape period (a finished request would still count as a stream).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from cadence.disagg.router.workers import Worker


def _ema(old: float, sample: float, alpha: float = 0.2) -> float:
    return (1 - alpha) * old + alpha * sample


@dataclass
class CostModel:
    """Online estimates; the defaults only matter until the first measurements arrive."""

    tokens_per_char: float = 0.3
    prefill_tok_s: float = 1000.0
    # Seconds of a prefill call that do not grow with its tokens (fitted with prefill_tok_s).
    prefill_fixed_s: float = 0.0
    transfer_bytes_s: float = 1e9
    kv_bytes_per_token: float = 0.0
    hop_s: float = 0.005
    # Mean of the requests in flight on the chosen decode worker seen by arrivals, forgetting
    # with this time constant (decayed sum / decayed count).
    concurrency_time_constant_s: float = 30.0
    _concurrency_sum: float = 0.0
    _concurrency_count: float = 0.0
    _concurrency_t: float | None = None
    # Decayed sums over idle prefill calls (tokens x, seconds y) for the fit y = fixed + x / rate.
    _fit: list[float] = field(default_factory=lambda: [0.0] * 5)  # n, x, y, xx, xy
    samples: dict[str, int] = field(default_factory=lambda: {
        "prompt": 0, "prefill": 0, "transfer": 0, "hop": 0, "arrival": 0})

    def observe_arrival(self, in_flight: int, now: float | None = None) -> None:
        """A request arrived while `in_flight` others ran on the decode worker it would use."""
        now = time.monotonic() if now is None else now
        if self._concurrency_t is not None:
            keep = math.exp(-max(0.0, now - self._concurrency_t)
                            / self.concurrency_time_constant_s)
            self._concurrency_sum *= keep
            self._concurrency_count *= keep
        self._concurrency_t = now
        self._concurrency_sum += in_flight
        self._concurrency_count += 1
        self.samples["arrival"] += 1

    @property
    def mean_in_flight(self) -> float:
        if self._concurrency_count <= 0:
            return 0.0
        return self._concurrency_sum / self._concurrency_count

    def observe_prompt(self, num_chars: int, num_tokens: int) -> None:
        if num_chars > 0 and num_tokens > 0:
            self.tokens_per_char = _ema(self.tokens_per_char, num_tokens / num_chars)
            self.samples["prompt"] += 1

    def observe_prefill(self, num_tokens: int, seconds: float, alpha: float = 0.2) -> None:
        """A prefill call to a worker that had nothing else outstanding: refit
        seconds = prefill_fixed_s + tokens / prefill_tok_s by least squares over the calls,
        older ones weighed down by (1 - alpha) per call. While the calls' lengths barely differ
        the fixed part cannot be told apart: all of it counts as per-token time."""
        if num_tokens < 1 or seconds <= 0:
            return
        x, y = float(num_tokens), float(seconds)
        self._fit = [(1 - alpha) * old + alpha * new
                     for old, new in zip(self._fit, (1.0, x, y, x * x, x * y))]
        n, sx, sy, sxx, sxy = self._fit
        mx, my = sx / n, sy / n
        var = sxx / n - mx * mx
        slope = (sxy / n - mx * my) / var if var > (0.1 * mx) ** 2 else 0.0
        fixed = my - slope * mx
        if slope <= 0 or fixed < 0:
            slope, fixed = my / mx, 0.0
        self.prefill_tok_s = 1.0 / slope
        self.prefill_fixed_s = fixed
        self.samples["prefill"] += 1

    def observe_transfers(self, num_bytes: float, seconds: float) -> None:
        if num_bytes > 0 and seconds > 0:
            self.transfer_bytes_s = _ema(self.transfer_bytes_s, num_bytes / seconds)
            self.samples["transfer"] += 1

    def observe_hop(self, seconds: float) -> None:
        if seconds > 0:
            self.hop_s = _ema(self.hop_s, seconds)
            self.samples["hop"] += 1

    def estimate_tokens(self, num_chars: int) -> int:
        return max(1, round(num_chars * self.tokens_per_char))

    def prefill_queue_s(self, num_calls: int, num_tokens: int) -> float:
        """Seconds for a prefill worker to get through `num_calls` calls of `num_tokens`."""
        return num_calls * self.prefill_fixed_s + num_tokens / self.prefill_tok_s

    def transfer_s(self, num_tokens: int) -> float:
        return num_tokens * self.kv_bytes_per_token / self.transfer_bytes_s

    def to_dict(self) -> dict:
        return {"tokens_per_char": self.tokens_per_char, "prefill_tok_s": self.prefill_tok_s,
                "prefill_fixed_s": self.prefill_fixed_s,
                "transfer_bytes_s": self.transfer_bytes_s,
                "kv_bytes_per_token": self.kv_bytes_per_token, "hop_s": self.hop_s,
                "mean_in_flight": self.mean_in_flight, "samples": dict(self.samples)}


@dataclass(frozen=True)
class Decision:
    disaggregate: bool
    reason: str
    gain_s: float = 0.0
    cost_s: float = 0.0
    streams: float = 0.0  # the streams the auto policy weighed (0 where it did not weigh)


class RoutingPolicy:
    """`auto` | `always` | `never` over one CostModel (see the module docstring)."""

    def __init__(self, name: str, model: CostModel, min_prompt_tokens: int = 0) -> None:
        self.name = name
        self.model = model
        self.min_prompt_tokens = min_prompt_tokens

    def decide(self, num_prompt_tokens: int, prefill: Worker | None, decode: Worker,
               wants_logprobs: bool = False) -> Decision:
        if prefill is None:
            return Decision(False, "no prefill worker")
        if self.name == "never":
            return Decision(False, "policy never")
        if wants_logprobs:
            # The first token's logprobs stay on the prefill worker: serve it whole.
            return Decision(False, "logprobs asked")
        if self.name == "always":
            return Decision(True, "policy always")
        if num_prompt_tokens < self.min_prompt_tokens:
            return Decision(False, "short prompt")
        m = self.model
        streams = max(decode.outstanding_requests, m.mean_in_flight)
        if streams == 0:
            return Decision(False, "no stream to protect")
        gain = streams * num_prompt_tokens / m.prefill_tok_s
        queue = m.prefill_queue_s(prefill.outstanding_requests, prefill.outstanding_tokens)
        cost = queue + m.transfer_s(num_prompt_tokens) + m.hop_s
        if gain > cost:
            return Decision(True, "interference outweighs handoff", gain, cost, streams)
        return Decision(False, "handoff costs more", gain, cost, streams)
