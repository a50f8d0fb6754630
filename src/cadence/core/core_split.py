"""CoreSplit: how many of the engine's cores the prefill team gets in the next interval.

The split engine (engine/split_stepper.py, --core-split auto) runs prompt chunks and decode
steps side by side on two thread teams. Each time the prefill team is free to start a chunk,
this decides the split from the measured load:
- no prompt tokens waiting, or a single core: 0 (colocated steps of the --policy on every
  core); no request decoding: the overlapped split below with overlap allowed (the prompt gets
  every core in chunks, a request that starts decoding meanwhile is stepped at once), else 0;
- otherwise the decode team gets the fewest cores whose measured step time, with a prefill
  running beside it, stays within the ITL target (the contended time: both teams share the
  memory bandwidth, so a decode step beside a prefill is slower than alone on the same
  cores), and the prefill team the rest. A thread count not measured yet is predicted from
  the nearest one measured, scaled by the core ratio (a pessimistic, compute-bound guess);
  with none measured yet, from the colocated step time times the core ratio times the
  machine's measured contention (core/contention.py).

With overlap allowed (--core-split auto; not with 'disjoint'), the prefill team gets every
core and the decode team one thread on top, its steps paced to the target (tried first, kept
while one such step takes at most OVERLAP_DUTY of the target)
(the stepper waits out the rest of each target interval): the decode thread borrows a core
for a short step now and then instead of holding one, so a document's prefill keeps most of
the machine while the streams keep the target's rhythm.

It also keeps each team's utilisation (busy seconds over wall seconds since the last stats
read) and the decode contention: contended step time per row over the colocated one's at all
cores, scaled by the core ratio (1.0: no interference beyond having fewer cores).
"""

from __future__ import annotations

from dataclasses import dataclass

# Weight of a new measurement in the running averages.
_EMA = 0.2
# Largest share of the ITL target one decode thread's step on the prefill team's cores may
# take for the overlap split (the engine paces its steps at 0.8 x the target).
OVERLAP_DUTY = 0.8


@dataclass(frozen=True)
class SplitDecision:
    """Threads of the decode and prefill teams for the next interval; prefill 0: colocated."""

    decode_threads: int
    prefill_threads: int

    @property
    def is_split(self) -> bool:
        return self.prefill_threads > 0

    def overlaps(self, num_cores: int) -> bool:
        """The teams share cores (the decode team's steps are then paced to the target)."""
        return self.prefill_threads > 0 and self.decode_threads + self.prefill_threads > num_cores


class CoreSplit:
    def __init__(self, num_cores: int, target_itl_s: float, allow_overlap: bool = True,
                 prior_contention: float | None = None) -> None:
        if num_cores < 1:
            raise ValueError(f"num_cores must be >= 1, got {num_cores}")
        self.num_cores = num_cores
        self.target_itl_s = target_itl_s
        self.allow_overlap = allow_overlap
        # The machine's measured decode contention (core/contention.py: the startup probe or
        # its per-machine cache), used until contended steps of this engine are measured.
        self.prior_contention = prior_contention
        # Decode step seconds per row, by decode-team threads, measured beside a prefill on
        # disjoint cores; with one thread sharing the prefill team's cores (overlap); and
        # colocated (every core, no prefill beside).
        self._contended_per_row: dict[int, float] = {}
        self._overlapped_per_row: float | None = None
        self._alone_per_row: float | None = None
        self._alone_fixed_s: float | None = None
        self.current = SplitDecision(num_cores, 0)
        self.num_changes = 0
        # Busy seconds of each team since the last take_utilisation().
        self._busy = {"decode": 0.0, "prefill": 0.0}

    # -- measurements -------------------------------------------------------------------
    def observe_decode(self, threads: int, rows: int, seconds: float, contended: bool,
                       overlapped: bool = False) -> None:
        """A decode step of `rows` rows took `seconds` on `threads` threads (beside a prefill
        when `contended`, on the prefill team's cores when `overlapped`)."""
        if rows <= 0:
            return
        self._busy["decode"] += seconds
        per_row = seconds / rows
        if overlapped:
            old = self._overlapped_per_row
            self._overlapped_per_row = per_row if old is None else (
                (1 - _EMA) * old + _EMA * per_row)
        elif contended:
            old = self._contended_per_row.get(threads)
            self._contended_per_row[threads] = per_row if old is None else (
                (1 - _EMA) * old + _EMA * per_row)
        elif threads == self.num_cores:
            old = self._alone_per_row
            self._alone_per_row = per_row if old is None else (1 - _EMA) * old + _EMA * per_row

    def observe_prefill(self, seconds: float) -> None:
        self._busy["prefill"] += seconds

    def take_busy(self) -> dict[str, float]:
        """Busy seconds per team since the last call (utilisation = busy / wall)."""
        busy, self._busy = self._busy, {"decode": 0.0, "prefill": 0.0}
        return busy

    @property
    def contention(self) -> float | None:
        """Decode slowdown beside a prefill beyond the core ratio (the machine's prior until
        this engine measured it; None without either)."""
        if self._alone_per_row is None or not self._contended_per_row:
            return self.prior_contention
        threads = max(self._contended_per_row)
        ideal = self._alone_per_row * self.num_cores / threads
        return self._contended_per_row[threads] / ideal

    def predict_decode_s(self, threads: int, rows: int) -> float | None:
        """Predicted contended decode step seconds on `threads` threads (None: no data)."""
        if threads in self._contended_per_row:
            return self._contended_per_row[threads] * rows
        if self._contended_per_row:
            nearest = min(self._contended_per_row, key=lambda t: abs(t - threads))
            return self._contended_per_row[nearest] * nearest / threads * rows
        if self._alone_per_row is not None:
            return (self._alone_per_row * self.num_cores / threads * rows
                    * (self.prior_contention or 1.0))
        return None

    def predict_alone_decode_s(self, rows: int) -> float | None:
        """Predicted decode step seconds on every core with nothing computing beside it (an
        interleaved step between a prompt chunk's layers; None: no data)."""
        return None if self._alone_per_row is None else self._alone_per_row * rows

    # -- the decision -------------------------------------------------------------------
    def decide(self, decode_rows: int, prompt_tokens_waiting: int) -> SplitDecision:
        """The split for the next interval (see the module docstring)."""
        cores = self.num_cores
        if cores < 2 or prompt_tokens_waiting == 0:
            decision = SplitDecision(cores, 0)
        elif decode_rows == 0:
            # Overlapped, the prefill team takes every core in chunks, and a request that
            # starts decoding meanwhile (a short prompt done in an earlier chunk) has the
            # decode thread at once; a colocated step would hold it for the whole step.
            decision = SplitDecision(1, cores) if self.allow_overlap else SplitDecision(cores, 0)
        else:
            decode = cores - 1
            for threads in range(1, cores):
                predicted = self.predict_decode_s(threads, decode_rows)
                if predicted is None or predicted <= self.target_itl_s:
                    decode = threads
                    break
            decision = SplitDecision(decode, cores - decode)
            if self.allow_overlap:
                # One thread on the prefill team's cores, tried first and kept while its
                # measured steps leave room in the target's rhythm.
                per_row = self._overlapped_per_row
                if per_row is None or per_row * decode_rows <= OVERLAP_DUTY * self.target_itl_s:
                    decision = SplitDecision(1, cores)
        if decision != self.current:
            self.num_changes += 1
            self.current = decision
        return decision
