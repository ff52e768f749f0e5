"""The main process's copy of each shard's journaled shuffle buffer, held as line numbers.

A worker sends, with each round's last item, the journal of every shuffle buffer the
round advanced (``ops``: ``(shard id, PUSH or the slot taken)``) and the lines pushed
(``pushed``, in op order; ``fmsdata.stages.savedlines.journal_spans``). Replaying the
journal only moves lines, so the copy here holds numbers, not lines: a pushed line is
``(its item's chunk << 32) | its place in the item``, a line of the buffer a shard resumed
with is ``-1 - its place in the saved buffer``. One compiled pass replays an item's whole
journal; nothing is sliced per line until a state is taken (``lines``), which then finds
each line in its chunk.

A chunk (an item's ``pushed`` and ``pushed_offsets``) is kept while any buffer still holds
one of its lines: the pass counts each chunk's lines still held, and a chunk whose count
reaches 0 is dropped. That is the memory the line views of a list of lines kept alive.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fmsdata.compiled import compiled
from fmsdata.narrowrows import NarrowRows
from fmsdata.stages.shuffle import PUSH

__all__ = ["BufferReplica"]

_SHIFT = 32  # line numbers: chunk << _SHIFT | place in the chunk


@compiled
def _replay(ops, row_of, buffers, lengths, chunk, live, base, push):  # type: ignore[no-untyped-def]
    """Apply ``ops`` to the buffers (``ShuffleBuffer``'s journal, as ``apply_journal``
    replays it); pushed lines are numbered ``chunk << _SHIFT | k`` in op order. Each line
    taken that belongs to a chunk lowers ``live[its chunk - base]``. Returns 0, or, doing
    nothing, the buffer width the ops need when ``buffers`` is narrower."""
    width = buffers.shape[1]
    sizes = lengths.copy()
    need = 0
    for i in range(ops.shape[0]):
        r = row_of[ops[i, 0]]
        if ops[i, 1] == push:
            sizes[r] += 1
            need = max(need, sizes[r])
        else:
            sizes[r] -= 1
    if need > width:
        return need
    k = 0
    for i in range(ops.shape[0]):
        r = row_of[ops[i, 0]]
        op = ops[i, 1]
        n = lengths[r]
        if op == push:
            buffers[r, n] = (chunk << _SHIFT) | k
            lengths[r] = n + 1
            k += 1
        else:
            line = buffers[r, op]
            if line >= 0:
                live[(line >> _SHIFT) - base] -= 1
            buffers[r, op] = buffers[r, n - 1]
            lengths[r] = n - 1
    return 0


class BufferReplica:
    """The journaled shuffle buffers of ``shard_ids``, as line numbers.

    Args:
        shard_ids: The shards (logical shard ids).
        restored: ``{shard id: lines}`` of the buffers the shards resumed with (absent:
            empty); their lines are numbered by place (``-1 - place``).
    """

    def __init__(self, shard_ids: Sequence[int], restored: dict[int, int]):
        ids = np.asarray(list(shard_ids), dtype=np.int64)
        self._row_of = np.full(int(ids.max()) + 1 if len(ids) else 0, -1, dtype=np.int64)
        self._row_of[ids] = np.arange(len(ids))
        width = max([1, *restored.values()])
        self._buffers = np.zeros((len(ids), width), dtype=np.int64)
        self._lengths = np.zeros(len(ids), dtype=np.int64)
        for sid, n in restored.items():
            row = self._row_of[sid]
            self._buffers[row, :n] = -1 - np.arange(n)
            self._lengths[row] = n
        # Chunks still held: chunk number base + i is _chunks[i] (None once dropped).
        self._base = 0
        self._chunks: list[tuple[NarrowRows, list[int]] | None] = []
        self._live = np.zeros(16, dtype=np.int64)

    def apply(self, ops: np.ndarray, pushed: NarrowRows, pushed_offsets: np.ndarray) -> None:
        """Replay one item's journal (``WorkerItem.ops``, ``pushed``, ``pushed_offsets``)."""
        if not len(ops):
            return
        chunk = self._base + len(self._chunks)
        if len(self._chunks) == len(self._live):
            self._live = np.concatenate([self._live, np.zeros_like(self._live)])
        # The bounds as ints: a state slices every held line (numpy scalars are slower).
        self._chunks.append((pushed, pushed_offsets.tolist()))
        self._live[len(self._chunks) - 1] = len(pushed_offsets) - 1
        lengths, live, base = self._lengths, self._live, self._base
        while True:
            old = self._buffers
            need = _replay(ops, self._row_of, old, lengths, chunk, live, base, PUSH)
            if not need:
                break
            self._buffers = np.zeros((len(old), max(need, 2 * old.shape[1])), dtype=np.int64)
            self._buffers[:, : old.shape[1]] = old
        self._drop()

    def _drop(self) -> None:
        """Forget the chunks none of whose lines is held, and the leading forgotten ones."""
        held = len(self._chunks)
        for i in np.flatnonzero(self._live[:held] == 0).tolist():
            self._chunks[i] = None
        first = 0
        while first < held and self._chunks[first] is None:
            first += 1
        if first * 2 >= held and first:
            del self._chunks[:first]
            rest = self._live[first:held].copy()
            self._live[:] = 0
            self._live[: len(rest)] = rest
            self._base += first

    def lines(self, sid: int) -> list[np.ndarray | int]:
        """Shard ``sid``'s buffer in slot order: each line a span array (a view of the
        pushed spans it came with), or an int, its place in the buffer it resumed with."""
        row = self._row_of[sid]
        out: list[np.ndarray | int] = []
        chunks, base = self._chunks, self._base
        for line in self._buffers[row, : self._lengths[row]].tolist():
            if line < 0:
                out.append(-1 - line)
                continue
            chunk = chunks[(line >> _SHIFT) - base]
            assert chunk is not None, "a held line's chunk is kept"
            rows, offsets = chunk
            spans = rows.array  # widened at the first state that reads the chunk
            k = line & ((1 << _SHIFT) - 1)
            out.append(spans[offsets[k] : offsets[k + 1]])
        return out
