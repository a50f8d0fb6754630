"""A `rich` progress bar for offline generation: requests done, and output tokens per second."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)


class GenerationProgress:
    """Context manager; does nothing when disabled (library use), draws on stderr otherwise."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._enabled = enabled
        self._num_tokens = 0
        self._progress: Progress | None = None
        self._task = None
        self._total = total

    def __enter__(self) -> GenerationProgress:
        if self._enabled:
            self._progress = Progress(
                TextColumn("generating"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[tok_s]:.1f} tok/s"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task("generate", total=self._total, tok_s=0.0)
        return self

    def tokens(self, n: int) -> None:
        self._num_tokens += n

    def finished(self) -> None:
        if self._progress is None:
            return
        task = self._progress.tasks[0]
        elapsed = task.elapsed or 0.0
        rate = self._num_tokens / elapsed if elapsed > 0 else 0.0
        self._progress.update(self._task, advance=1, tok_s=rate)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
