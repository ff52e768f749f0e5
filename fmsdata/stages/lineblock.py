"""Lines of spans held together: one span array and each line's bounds into it.

A worker handles a few thousand lines a second per shard, each of a few dozen spans at
most. Held one numpy array per line, every line paid a slice, a copy and a list entry at
each stage it crossed (the packer, the shuffle buffer, the round's deal, the writer, the
journal): on short documents that Python work per line was a fifth of a worker's time. The
built-in stages hand lines on a block at a time instead (``SpanStage.take_lines``), and the
steps between them are one compiled pass over a block's spans (``gather``).

A user's stage still sees and yields one line at a time (``__next__``, ``take``): a block
is made of its lines where it meets a built-in stage, and split into lines where it meets
the user's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from fmsdata.stages.spans import SPAN_WIDTH
from fmsdata.util.compiled import compiled

__all__ = ["LineBlock", "SpanScratch", "as_block", "chained_offsets", "copy_rows", "gather_rows"]


@dataclasses.dataclass(frozen=True)
class LineBlock:
    """``len(offsets) - 1`` lines: line ``i`` is ``spans[offsets[i]:offsets[i + 1]]``.

    Attributes:
        spans: ``[pieces, SPAN_WIDTH]`` int64, C-contiguous (the runtime span columns,
            ``fmsdata.stages.base``).
        offsets: ``[lines + 1]`` int64, from 0, non-decreasing, ending at ``len(spans)``.
    """

    spans: np.ndarray
    offsets: np.ndarray

    @classmethod
    def empty(cls) -> LineBlock:
        return cls(np.zeros((0, SPAN_WIDTH), dtype=np.int64), np.zeros(1, dtype=np.int64))

    @classmethod
    def of(cls, lines: Sequence[np.ndarray]) -> LineBlock:
        """The lines in one block (their spans copied)."""
        if not lines:
            return cls.empty()
        offsets = np.zeros(len(lines) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, lines), dtype=np.int64, count=len(lines)), out=offsets[1:])
        return cls(np.ascontiguousarray(np.concatenate(lines), dtype=np.int64), offsets)

    @classmethod
    def concat(cls, blocks: Sequence[LineBlock], into: SpanScratch | None = None) -> LineBlock:
        """The blocks' lines one after another (in ``into``'s rows, when given)."""
        if len(blocks) == 1 and into is None:
            return blocks[0]
        if not blocks:
            return cls.empty()
        offsets = chained_offsets([b.offsets for b in blocks])
        spans = [b.spans for b in blocks]
        if into is None:
            return cls(np.concatenate(spans), offsets)
        return cls(np.concatenate(spans, out=into.rows(int(offsets[-1]))), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def counts(self) -> np.ndarray:
        """Spans per line."""
        return np.diff(self.offsets)

    def line(self, i: int) -> np.ndarray:
        """Line ``i`` (a view into the block)."""
        return self.spans[self.offsets[i] : self.offsets[i + 1]]

    def lines(self) -> list[np.ndarray]:
        """Each line as its own array (copies: a line kept does not keep the block)."""
        bounds = self.offsets.tolist()
        spans = self.spans
        return [spans[bounds[i] : bounds[i + 1]].copy() for i in range(len(bounds) - 1)]

    def slice(self, start: int, stop: int) -> LineBlock:
        """Lines ``start .. stop - 1`` (views)."""
        a, b = int(self.offsets[start]), int(self.offsets[stop])
        return LineBlock(self.spans[a:b], self.offsets[start : stop + 1] - a)

    def gather(self, which: np.ndarray, into: SpanScratch | None = None) -> LineBlock:
        """Lines ``which`` (line numbers, any order, repeats allowed) in that order, copied
        into a new block (into ``into``'s rows, when given)."""
        which = np.asarray(which, dtype=np.int64)
        starts = self.offsets[which]
        return gather_rows(self.spans, starts, self.offsets[which + 1] - starts, into)


class SpanScratch:
    """Span rows reused from one round (or item) to the next, for blocks that live no
    longer than that: a worker's round of lines is a megabyte or so, and allocating it
    afresh each round leaves the allocator's heap fragmented (tens of megabytes of a
    worker's private memory on 60-token documents)."""

    def __init__(self) -> None:
        self._rows = np.empty((0, SPAN_WIDTH), dtype=np.int64)

    def rows(self, n: int) -> np.ndarray:
        """The first ``n`` rows (what they held before is overwritten by the caller)."""
        if len(self._rows) < n:
            self._rows = np.empty((n + n // 4, SPAN_WIDTH), dtype=np.int64)
        return self._rows[:n]


def gather_rows(
    rows: np.ndarray, starts: np.ndarray, counts: np.ndarray, into: SpanScratch | None = None
) -> LineBlock:
    """The runs ``rows[starts[i]:starts[i] + counts[i]]`` as the lines of a new block,
    copied (into ``into``'s rows, when given)."""
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    n = int(offsets[-1])
    out = np.empty((n, SPAN_WIDTH), dtype=np.int64) if into is None else into.rows(n)
    copy_rows(rows, starts, counts, out)
    return LineBlock(out, offsets)


def chained_offsets(offsets: Sequence[np.ndarray]) -> np.ndarray:
    """The line bounds of blocks laid one after another (each block's ``offsets``, from 0):
    each block's bounds moved past the rows of the blocks before it."""
    ends = np.cumsum([0] + [int(o[-1]) for o in offsets[:-1]])
    return np.concatenate(
        [np.zeros(1, dtype=np.int64)] + [o[1:] + end for o, end in zip(offsets, ends)]
    )


def as_block(lines: Sequence[np.ndarray] | LineBlock) -> LineBlock:
    """``lines`` as a block (a block as it is)."""
    return lines if isinstance(lines, LineBlock) else LineBlock.of(lines)


@compiled
def copy_rows(rows, starts, counts, out):  # type: ignore[no-untyped-def]
    """Runs ``rows[starts[i]:starts[i] + counts[i]]`` into ``out``, one after another."""
    at = 0
    for i in range(len(starts)):
        for r in range(starts[i], starts[i] + counts[i]):
            for c in range(rows.shape[1]):
                out[at, c] = rows[r, c]
            at += 1
