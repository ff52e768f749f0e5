"""A 2-D integer array that crosses a process boundary with narrow columns.

What a DataLoader worker sends is pickled, pushed through a pipe in 64 KiB chunks and
copied out of the pickle in the main process, which pays for every byte. Arrays of
numbers that are small in practice (dataset and file numbers, lengths under a line) but
not by type travel in far fewer bytes one column at a time; packed, they can also be left
in shared memory (``keep_in``, ``fmsdata.journalarena``) and travel as their place.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fmsdata.journalarena import ArenaBlob

__all__ = ["NarrowRows"]

# (rows, width), the array's dtype, (column, travel dtype) in blob order, the blob (its
# bytes, or where a worker left them: ``fmsdata.journalarena``).
_Packed = tuple[tuple[int, int], str, tuple[tuple[int, str], ...], np.ndarray | ArenaBlob]


class NarrowRows:
    """A 2-D integer array that travels column by column, each in the narrowest integer
    type that holds its values, and is widened back where it is read (``array``).

    An item's pushed spans (``WorkerItem.pushed``: dataset, file, document, start, length
    of every piece of every line pushed into a shuffle buffer) are most of its bytes on
    short documents, and the main process's cost of receiving an item grows with its bytes
    (the pipe's chunks, then a copy out of the pickle): 1.2 ms an item for 60-token
    documents, 0.7 ms with two fifths of the bytes. Their columns are small (dataset and
    file numbers, lengths under a line), so most travel in one or two bytes. Nothing is
    packed where nothing is pickled (no workers), and the main process widens a chunk only
    when a state reads its lines.
    """

    __slots__ = ("_array", "_packed")

    def __init__(self, array: np.ndarray):
        if array.ndim != 2 or array.dtype.kind not in "iu":
            raise TypeError(
                f"NarrowRows holds a 2-D integer array, got {array.dtype} {array.shape}"
            )
        array.flags.writeable = False  # packed once: a later change would not travel
        self._array: np.ndarray | None = array
        self._packed: _Packed | None = None

    @property
    def array(self) -> np.ndarray:
        """The rows in their own dtype (read-only)."""
        array = self._array
        if array is None:
            packed = self._packed
            if packed is None:  # another thread widened them meanwhile
                assert self._array is not None
                return self._array
            (rows, width), dtype, columns, blob = packed
            if isinstance(blob, ArenaBlob):
                blob = blob.array
            array = np.empty((rows, width), dtype=dtype)
            at = 0
            for j, kind in columns:
                values = np.frombuffer(blob, dtype=kind, count=rows, offset=at)
                array[:, j] = values
                at += values.nbytes
            array.flags.writeable = False
            self._array = array  # before the blob goes: a reader finds one or the other
            self._packed = None  # an arena's blocks are free again
        return array

    def keep_in(self, store: Callable[[np.ndarray], ArenaBlob | None]) -> None:
        """Pack the rows now and leave the packed bytes where ``store`` puts them (a
        worker's region of a ``JournalArena``): they then travel as their place. Where
        ``store`` finds no room (None), they travel in the pickle as before."""
        packed = self.__getstate__()
        assert isinstance(packed[3], np.ndarray)
        kept = store(packed[3])
        if kept is not None:
            self._packed = (*packed[:3], kept)
            self._array = None  # the worker reads them no more

    def __getstate__(self) -> _Packed:
        if self._packed is None:
            array = self.array
            columns = np.ascontiguousarray(array.T)  # one pass; then each column is contiguous
            kinds = [(j, _narrowest(column)) for j, column in enumerate(columns)]
            # Widest first: every column starts aligned for its type.
            kinds.sort(key=lambda jk: -np.dtype(jk[1]).itemsize)
            blob = np.empty(sum(len(array) * np.dtype(k).itemsize for _, k in kinds), np.uint8)
            at = 0
            for j, kind in kinds:
                size = len(array) * np.dtype(kind).itemsize
                blob[at : at + size].view(kind)[...] = columns[j]
                at += size
            shape = (int(array.shape[0]), int(array.shape[1]))
            self._packed = (
                shape,
                array.dtype.str,
                tuple((j, np.dtype(k).str) for j, k in kinds),
                blob,
            )
        return self._packed

    def __setstate__(self, state: _Packed) -> None:
        self._array, self._packed = None, state


_NARROW_TYPES = (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32)


def _narrowest(column: np.ndarray) -> np.dtype:
    """The narrowest integer type holding every value of ``column`` (its own type where
    none of the narrow ones is narrower)."""
    if not len(column):
        return column.dtype
    low, high = int(column.min()), int(column.max())
    for kind in _NARROW_TYPES:
        info = np.iinfo(kind)
        if info.min <= low and high <= info.max:
            if np.dtype(kind).itemsize < column.dtype.itemsize:
                return np.dtype(kind)
            break
    return column.dtype
