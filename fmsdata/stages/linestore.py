"""The lines a shuffle buffer holds: one span array they are appended to, and slots.

A shuffle buffer holds a window of lines and swaps one out at a random slot per step.
Its lines live in one array of span rows (``rows``), appended to as lines come in; a slot
is the ``(start, count)`` of its line's rows. A step moves slot pairs, a hand-out copies
the rows of the lines taken into one block: no numpy array per line. The rows of lines
handed out stay behind until the array fills; then the held lines are moved to its front,
in place, and the array is sized to a quarter more than the rows held and coming in (so
it keeps about 1.25 times the spans of the window and of one take's pushes, and each span
is moved about four times on average: a few percent of what writing its tokens costs). A
line's rows may move at any step: views of them are read, never kept. A ``snapshot`` (a
worker's state at a round's end) keeps the rows array as it is: the store then never
writes over the rows held, and its next compaction moves them into a new array.

A slot may also stand for a line of a loaded state not measured yet (count -1, start:
the line's number in the saved form): the buffer measures it when it is handed out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fmsdata.stages.lineblock import LineBlock, gather_rows
from fmsdata.stages.spans import SPAN_WIDTH
from fmsdata.util.compiled import compiled

__all__ = ["LineStore", "RESTORED"]

RESTORED = -1  # a slot's count when it holds a restored line not measured yet
_MIN_ROWS = 256


class LineStore:
    """Lines by slot, as a shuffle buffer holds them (see the module docstring).

    Args:
        slots: The most lines held at once.
    """

    def __init__(self, slots: int):
        self.rows = np.empty((_MIN_ROWS, SPAN_WIDTH), dtype=np.int64)
        self.end = 0  # rows used
        self.held = 0  # rows of the held lines
        self.start = np.zeros(max(slots, 0) + 2, dtype=np.int64)
        self.count = np.zeros(max(slots, 0) + 2, dtype=np.int64)
        self.size = 0  # slots held
        self._shared = False  # rows is held by a snapshot: compact into a new array

    def __len__(self) -> int:
        return self.size

    def lines(self) -> list[np.ndarray | int]:
        """The held lines in slot order: span arrays (views), or the saved-form number of
        a restored line not measured yet."""
        rows = self.rows
        return [
            int(a) if n == RESTORED else rows[a : a + n]
            for a, n in zip(self.start[: self.size].tolist(), self.count[: self.size].tolist())
        ]

    def snapshot(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The held lines as ``(rows, start, count)`` that stay as they are while the store
        goes on: the slots copied, the rows shared (rows are only appended after the
        rows held, and the next compaction moves the held lines into a new array)."""
        self._shared = True
        return self.rows, self.start[: self.size].copy(), self.count[: self.size].copy()

    def reset(self, lines: Sequence[np.ndarray | int]) -> None:
        """Hold ``lines`` (span arrays, or ints: restored lines by number) in this order."""
        if len(lines) + 2 > len(self.start):
            self.start = np.zeros(len(lines) + 2, dtype=np.int64)
            self.count = np.zeros(len(lines) + 2, dtype=np.int64)
        arrays = [line for line in lines if isinstance(line, np.ndarray)]
        block = LineBlock.of(arrays)
        rows = len(block.spans) + len(block.spans) // 4
        self.rows = np.empty((max(rows, _MIN_ROWS), SPAN_WIDTH), dtype=np.int64)
        self.rows[: len(block.spans)] = block.spans
        self.end = self.held = len(block.spans)
        self._shared = False
        k = 0
        for slot, line in enumerate(lines):
            if isinstance(line, np.ndarray):
                self.start[slot] = block.offsets[k]
                self.count[slot] = block.offsets[k + 1] - block.offsets[k]
                k += 1
            else:
                self.start[slot], self.count[slot] = line, RESTORED
        self.size = len(lines)

    def steps(
        self, pushed: LineBlock, hashes: np.ndarray, window: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Make one buffer step per hash (``ShuffleBuffer``'s docstring), the lines pushed
        taken from ``pushed`` in order; returns the ``(start, count)`` of each line handed
        out, in order (until the next ``steps``)."""
        self._room(len(pushed.spans))
        base = self.end
        self.rows[base : base + len(pushed.spans)] = pushed.spans
        self.end += len(pushed.spans)
        taken_start = np.empty(len(hashes), dtype=np.int64)
        taken_count = np.empty(len(hashes), dtype=np.int64)
        self.size, taken_rows = _steps(
            self.size, window, hashes, self.start, self.count, pushed.offsets, base,
            taken_start, taken_count,
        )  # fmt: skip
        self.held += len(pushed.spans) - taken_rows
        return taken_start, taken_count

    def gather(self, start: np.ndarray, count: np.ndarray) -> LineBlock:
        """The lines whose rows are ``start``/``count`` (measured lines only), copied."""
        return gather_rows(self.rows, start, count)

    def _room(self, incoming: int) -> None:
        """Make room for ``incoming`` rows at the end. When the array is full, or more than
        twice the size it needs (after a take much larger than the rest, e.g. a resume's
        replay), move the held lines to its front, and size it to a quarter more than the
        held and incoming rows where it has less room, or more than twice that."""
        need = self.held + incoming
        room = max(need + need // 4, _MIN_ROWS)
        if self.end + incoming <= len(self.rows) and len(self.rows) <= 2 * room:
            return
        resize = need > len(self.rows) or 2 * room < len(self.rows)
        into = self.rows
        if resize or self._shared:
            into = np.empty((room if resize else len(self.rows), SPAN_WIDTH), dtype=np.int64)
        self.end = _compact(self.rows, into, self.start, self.count, self.size, RESTORED)
        self.rows, self._shared = into, False


@compiled
def _steps(  # type: ignore[no-untyped-def]
    size, window, hashes, start, count, offsets, base, taken_start, taken_count
):
    """Step ``k`` pushes the next lines of ``offsets`` (rows from ``base``; up to two,
    while below ``window``), then hands out the line at slot ``hashes[k] % size``, the last
    slot's line taking its place. Returns the slots held after the last step and the rows
    of the measured lines handed out."""
    incoming = 0
    taken_rows = 0
    for k in range(len(hashes)):
        for _ in range(min(2, max(window - size, 0))):
            start[size] = base + offsets[incoming]
            count[size] = offsets[incoming + 1] - offsets[incoming]
            incoming += 1
            size += 1
        slot = np.int64(hashes[k] % np.uint64(size))
        taken_start[k] = start[slot]
        taken_count[k] = count[slot]
        taken_rows += max(count[slot], 0)
        size -= 1
        start[slot] = start[size]
        count[slot] = count[size]
    return size, taken_rows


@compiled
def _compact(rows, into, start, count, size, restored):  # type: ignore[no-untyped-def]
    """Move the held slots' rows to the front of ``into`` (``rows`` itself, or a new
    array), one line after another in the order they lie (so no line is overwritten before
    it moves), and point the slots at them; returns the rows used."""
    order = np.argsort(start[:size])
    at = 0
    for k in range(size):
        slot = order[k]
        n = count[slot]
        if n == restored:  # its start is a line number, not a row
            continue
        a = start[slot]
        for r in range(n):
            for c in range(rows.shape[1]):
                into[at + r, c] = rows[a + r, c]
        start[slot] = at
        at += n
    return at
