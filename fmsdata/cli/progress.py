"""A minimal progress bar for the CLI; silent when stderr is not a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress", "human", "human_bytes"]


def human(n: float, units: tuple[str, ...] = ("", "k", "M", "G", "T")) -> str:
    """``1.5M`` style: powers of 1000 named by ``units``, whole numbers in the first."""
    k = 0
    while abs(n) >= 1000 and k < len(units) - 1:
        n, k = n / 1000, k + 1
    return f"{n:.{1 if k else 0}f}{units[k]}"


def human_bytes(n: float) -> str:
    """``1.5 GB`` style (powers of 1000, as transfer tools print them)."""
    return human(n, (" B", " kB", " MB", " GB", " TB"))


class Progress:
    """Counts work done and redraws one status line at most ten times a second.

    Args:
        total: Units expected (None when unknown).
        unit: What is counted ("files", "B", ...).
        stream: Where to draw (default stderr); nothing is drawn unless it is a terminal.
    """

    def __init__(self, total: int | None, unit: str, stream: TextIO | None = None, label: str = ""):
        self.total = total
        self.unit = unit
        self.label = label
        self.done = 0
        self.extra = ""
        self._stream = stream or sys.stderr
        self._live = self._stream.isatty()
        self._start = time.monotonic()
        self._drawn = 0.0

    def update(self, n: int = 1, extra: str = "") -> None:
        self.done += n
        if extra:
            self.extra = extra
        now = time.monotonic()
        if self._live and now - self._drawn > 0.1:
            self._drawn = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = max(now - self._start, 1e-9)
        rate = self.done / elapsed
        show = human_bytes if self.unit == "B" else (lambda n: f"{n:,.0f}")
        unit = "" if self.unit == "B" else f" {self.unit}"
        if self.total:
            width = 30
            filled = int(width * min(self.done / self.total, 1.0))
            bar = f"[{'#' * filled}{'.' * (width - filled)}] {show(self.done)}/{show(self.total)}"
        else:
            bar = show(self.done)
        self._stream.write(f"\r{self.label}{bar}{unit} ({show(rate)}{unit}/s) {self.extra}\033[K")
        self._stream.flush()

    def close(self) -> None:
        if self._live:
            self._draw(time.monotonic())
            self._stream.write("\n")
            self._stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
