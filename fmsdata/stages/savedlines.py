"""Buffered lines in their saved form: narrow columns, documents' ends left to the index.

A shuffle buffer holds thousands of packed lines per rank, and saved as five integers per
span they are most of a loader state. Yet most spans of a packed line run to the end of
their document (every piece of a hard-packed line but its last: whole documents, and the
rest of the document the previous line split), and a document's length is in the files'
index. So the saved form leaves those lengths out — ``length`` 0 means "to the end of the
document" — and a resume finds them again from the files (``DocumentLengths``), as the
line writer finds a restored span's document facts. Each line also keeps how many tokens
it holds of each dataset (``tokens``): what ``fmsdata state show`` counts without the
data, and what a resume checks the lengths it finds against, so a span never silently
means other tokens than it did when saved.

The saved form (each array of the narrowest unsigned integer type its values fit; readers
take any integer type)::

    {"offsets": [lines + 1] line bounds into the span columns,
     "ds", "file", "doc", "start", "length": [spans] span columns (length 0: to the end),
     "tokens": [lines, datasets] tokens each line holds of each dataset}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from fmsdata.errors import StateMismatchError
from fmsdata.stages.deferred import Deferred
from fmsdata.stages.docfacts import document_facts
from fmsdata.stages.linestore import RESTORED
from fmsdata.stages.spans import (
    BASE,
    DLEN,
    DS,
    LENGTH,
    SAVED_SPAN_WIDTH,
    SPAN_WIDTH,
    START,
    restore_spans,
)
from fmsdata.util.compiled import compiled
from fmsdata.util.statecheck import fail, need_keys

__all__ = [
    "SavedLines",
    "DocumentLengths",
    "pack_lines",
    "pack_rows",
    "PackedLater",
    "unpack_lines",
    "resolve",
    "COLUMNS",
    "KEYS",
]

COLUMNS = ("ds", "file", "doc", "start", "length")  # in span column order
KEYS = ("offsets", *COLUMNS, "tokens")
_NARROW = ((np.uint8, 2**8 - 1), (np.uint16, 2**16 - 1), (np.uint32, 2**32 - 1))
_INT32_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class SavedLines:
    """A saved buffer read back: spans whose ``length`` is 0 where a span runs to the end
    of its document, line bounds, and each line's tokens per dataset.

    Attributes:
        spans: ``[n, SAVED_SPAN_WIDTH]`` int64.
        offsets: ``[lines + 1]`` int64 bounds of each line's spans.
        tokens: ``[lines, datasets]`` int64.
    """

    spans: np.ndarray
    offsets: np.ndarray
    tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def line(self, i: int) -> np.ndarray:
        return self.spans[self.offsets[i] : self.offsets[i + 1]]

    def held(self) -> np.ndarray:
        """A copy of the spans (length 0: to the end)."""
        return self.spans.copy()

    def renumbered(self, spans: np.ndarray, number: np.ndarray) -> SavedLines:
        """These lines with the saved ``spans`` given (datasets renumbered already) and the
        token counts moved to the datasets' new numbers ``number`` (-1: gone)."""
        width = int(number.max()) + 1 if number.size else 0
        tokens = np.zeros((len(self), width), dtype=np.int64)
        for old in range(min(self.tokens.shape[1], len(number))):
            if number[old] >= 0:
                tokens[:, number[old]] += self.tokens[:, old]
        return SavedLines(spans, self.offsets, tokens)


_NONE_SAVED = SavedLines(
    np.zeros((0, SAVED_SPAN_WIDTH), dtype=np.int64),
    np.zeros(1, dtype=np.int64),
    np.zeros((0, 0), dtype=np.int64),
)


def _narrow(values: np.ndarray, low: int, high: int) -> np.ndarray:
    """``values`` (int64, smallest ``low``, largest ``high``) in the narrowest unsigned
    type that holds them (int64 if one is negative, which a reader then refuses by name)."""
    if not values.size:
        return values.astype(np.uint8)
    if low < 0:
        return values.astype(np.int64)
    for dtype, most in _NARROW:
        if high <= most:
            return values.astype(dtype)
    return values.astype(np.uint64)


def pack_lines(
    lines: Sequence[np.ndarray | int], saved: SavedLines | None = None, to_end: bool = True
) -> dict[str, np.ndarray]:
    """Lines of spans in their saved form (see the module docstring).

    Args:
        lines: Each a span array, or an int: that line of ``saved`` (a buffer read back and
            not yet measured, whose lengths and token counts are carried over). A span
            array has the runtime columns (a span whose ``dlen`` is ``start + length`` runs
            to the end) or the saved ones (a length of 0 runs to the end).
        saved: The lines the ints refer to.
        to_end: Leave out the lengths of spans known to run to the end of their document.
            Off for a buffer that could not find them again.
    """
    arrays = [line for line in lines if isinstance(line, np.ndarray)]
    rows = np.full((sum(map(len, arrays)), SPAN_WIDTH), -1, dtype=np.int64)
    start = np.empty(len(lines), dtype=np.int64)
    count = np.empty(len(lines), dtype=np.int64)
    at = 0
    for k, line in enumerate(lines):
        if isinstance(line, np.ndarray):
            rows[at : at + len(line), : line.shape[1]] = line[:, :SPAN_WIDTH]
            start[k], count[k] = at, len(line)
            at += len(line)
        else:
            start[k], count[k] = int(line), RESTORED
    return pack_rows(rows, start, count, len(lines), saved, to_end)


def pack_rows(
    rows: np.ndarray,
    start: np.ndarray,
    count: np.ndarray,
    n_lines: int,
    saved: SavedLines | None = None,
    to_end: bool = True,
) -> dict[str, np.ndarray]:
    """``pack_lines`` of lines held as runs of span rows: line ``k`` is
    ``rows[start[k]:start[k] + count[k]]`` (runtime columns), or, where ``count[k]`` is -1,
    line ``start[k]`` of ``saved``. How a shuffle buffer saves its store
    (``fmsdata.stages.linestore``): one compiled pass, no array per line. It runs when a
    state is read or leaves a worker (``PackedLater``): with workers, for every buffered
    span of every shard a round visits."""
    if saved is None:
        saved = _NONE_SAVED
    columns, offsets, tokens, low, high = _saved_form(
        rows, start, count, n_lines, RESTORED, saved.spans, saved.offsets, saved.tokens, to_end
    )
    packed = {"offsets": _narrow(offsets, 0, int(offsets[-1]))}
    for c, key in enumerate(COLUMNS):
        packed[key] = _narrow(columns[c], int(low[c]), int(high[c]))
    packed["tokens"] = np.asfortranarray(_narrow(tokens, int(low[-1]), int(high[-1])))
    return packed


class PackedLater(Deferred):
    """``pack_rows`` of a snapshot of a shuffle buffer's store (``LineStore.snapshot``),
    packed when made: the state a worker takes every round costs no pass over the
    window's spans (see ``fmsdata.stages.deferred``)."""

    __slots__ = ("_rows", "_start", "_count", "_saved", "_to_end")

    def __init__(
        self,
        rows: np.ndarray,
        start: np.ndarray,
        count: np.ndarray,
        saved: SavedLines | None,
        to_end: bool,
    ):
        self._rows, self._start, self._count = rows, start, count
        self._saved, self._to_end = saved, to_end

    def make(self) -> dict[str, np.ndarray]:
        return pack_rows(
            self._rows, self._start, self._count, len(self._start), self._saved, self._to_end
        )


@compiled
def _saved_form(rows, start, count, n, restored, s_spans, s_offsets, s_tokens, to_end):  # type: ignore[no-untyped-def]
    """The saved columns ``[SAVED_SPAN_WIDTH, spans]``, line bounds and tokens per line and
    dataset of lines ``k < n`` (``pack_rows``): a span known by its ``dlen`` to run to the
    end of its document saved with length 0; a restored line copied with its counts. Also
    the smallest and largest value of each column and, last, of the tokens (so the caller
    narrows them without another pass)."""
    total = 0
    width = s_tokens.shape[1]
    for k in range(n):
        if count[k] == restored:
            total += s_offsets[start[k] + 1] - s_offsets[start[k]]
        else:
            total += count[k]
            for r in range(start[k], start[k] + count[k]):
                width = max(width, rows[r, DS] + 1)
    columns = np.empty((SAVED_SPAN_WIDTH, total), dtype=np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    tokens = np.zeros((n, width), dtype=np.int64)
    at = 0
    for k in range(n):
        if count[k] == restored:
            line = start[k]
            for r in range(s_offsets[line], s_offsets[line + 1]):
                for c in range(SAVED_SPAN_WIDTH):
                    columns[c, at] = s_spans[r, c]
                at += 1
            for d in range(s_tokens.shape[1]):
                tokens[k, d] = s_tokens[line, d]
        else:
            for r in range(start[k], start[k] + count[k]):
                for c in range(SAVED_SPAN_WIDTH):
                    columns[c, at] = rows[r, c]
                length = rows[r, LENGTH]
                tokens[k, rows[r, DS]] += length
                if to_end and rows[r, START] + length == rows[r, DLEN]:
                    columns[LENGTH, at] = 0
                at += 1
        offsets[k + 1] = at
    low = np.zeros(SAVED_SPAN_WIDTH + 1, dtype=np.int64)
    high = np.zeros(SAVED_SPAN_WIDTH + 1, dtype=np.int64)
    for c in range(SAVED_SPAN_WIDTH):
        for i in range(total):
            low[c] = min(low[c], columns[c, i])
            high[c] = max(high[c], columns[c, i])
    for k in range(n):
        for d in range(width):
            low[-1] = min(low[-1], tokens[k, d])
            high[-1] = max(high[-1], tokens[k, d])
    return columns, offsets, tokens, low, high


def _int_array(value: Any, path: str, ndim: int) -> np.ndarray:
    array = np.asarray(value) if not isinstance(value, (dict, str)) else np.asarray(None)
    if array.dtype.kind not in "iu":
        if array.size == 0 and array.dtype.kind == "f":  # an empty list read back from JSON
            array = array.astype(np.int64)
        else:
            raise fail(path, f"expected integers, got {array.dtype} {value!r:.80}")
    if array.ndim != ndim:
        raise fail(path, f"must be a {ndim}-d array, got shape {array.shape}")
    if array.dtype == np.uint64 and array.size and int(array.max()) >= 2**63:
        raise fail(path, f"value {int(array.max())} is out of range")
    array = array.astype(np.int64)
    negative = np.argwhere(array < 0)
    if len(negative):
        index = "".join(f"[{int(i)}]" for i in negative[0])
        raise fail(f"{path}{index}", f"must be at least 0, got {int(array[tuple(negative[0])])}")
    return array


def unpack_lines(packed: Any) -> SavedLines:
    """Read a saved buffer back strictly: every array's type, shape and values, the line
    bounds, and each line's token counts against its spans (paths relative to the
    buffer: ``doc[4]``, ``tokens[2][1]``).

    Raises:
        StateMismatchError: Naming the field, the index and the value.
    """
    need_keys(packed, "", KEYS)
    columns = [_int_array(packed[key], key, 1) for key in COLUMNS]
    offsets = _int_array(packed["offsets"], "offsets", 1)
    tokens = _int_array(packed["tokens"], "tokens", 2)
    n = len(columns[0])
    for key, column in zip(COLUMNS, columns):
        if len(column) != n:
            raise fail(key, f"holds {len(column)} spans, {COLUMNS[0]} holds {n}")
    if offsets.size < 1 or offsets[0] != 0 or offsets[-1] != n:
        raise fail("offsets", f"do not bound the {n} spans: {offsets.tolist()[:20]}")
    if np.any(np.diff(offsets) <= 0):
        raise fail(
            "offsets", f"must be strictly increasing (no empty line): {offsets.tolist()[:20]}"
        )
    n_lines = len(offsets) - 1
    width = tokens.shape[1]
    if len(tokens) != n_lines:
        raise fail("tokens", f"holds {len(tokens)} lines, offsets bound {n_lines}")
    ds, length = columns[DS], columns[LENGTH]
    past = np.flatnonzero(ds >= width)
    if len(past):
        i = int(past[0])
        raise fail(f"ds[{i}]", f"names dataset {int(ds[i])}, past the {width} that tokens counts")
    line = np.repeat(np.arange(n_lines), np.diff(offsets))
    cell = line * width + ds
    known = np.bincount(cell, weights=length, minlength=n_lines * width).reshape(tokens.shape)
    ends = np.bincount(cell, weights=length == 0, minlength=n_lines * width).reshape(tokens.shape)
    bad = np.argwhere(np.where(ends > 0, tokens < known + ends, tokens != known))
    if len(bad):
        row, col = (int(v) for v in bad[0])
        raise fail(
            f"tokens[{row}][{col}]",
            f"line {row} holds {int(known[row, col])} tokens of dataset {col} in spans of known "
            f"length and {int(ends[row, col])} span(s) to the end of a document (a token "
            f"each at least), which cannot make {int(tokens[row, col])}",
        )
    return SavedLines(np.stack(columns, axis=1).reshape(n, SAVED_SPAN_WIDTH), offsets, tokens)


class DocumentLengths:
    """Document facts from the files, for spans read back from a saved state: ``dlen``
    and ``base`` of every span, and the length of those that run to the end.

    Args:
        accesses: The datasets' files, indexed by a span's dataset field.
        decoration: How documents are decorated (their lengths counted).
    """

    def __init__(self, accesses: Sequence[Any], decoration: Any):
        self.accesses = accesses
        self.decoration = decoration

    def fill(self, spans: np.ndarray) -> np.ndarray:
        """Fill in ``spans`` (runtime layout, in place) from the files; raise
        StateMismatchError (path ``ds``/``file``/``doc``/``start``/``length`` with the span
        index) for a span that does not fit them.

        Returns:
            The mask of spans left to the end without a length: their dataset has no
            files here.
        """
        ds = spans[:, DS]
        here = ds < len(self.accesses)
        decoration = self.decoration
        given = spans[:, :SAVED_SPAN_WIDTH].copy()

        def refuse(field: str, i: int, message: str) -> StateMismatchError:
            return fail(
                f"{field}[{i}]",
                f"span {given[i].tolist()} (dataset, file, doc, start, length; length 0: to "
                f"the end) {message}",
            )

        for d in np.unique(ds[here]).tolist():
            rows = np.flatnonzero(ds == d)
            spans[rows, DLEN], spans[rows, BASE] = document_facts(
                spans, rows, self.accesses[d], decoration, refuse
            )
        to_end = here & (spans[:, LENGTH] == 0)
        spans[to_end, LENGTH] = spans[to_end, DLEN] - spans[to_end, START]
        outside = np.flatnonzero(
            here & ((spans[:, LENGTH] < 1) | (spans[:, START] + spans[:, LENGTH] > spans[:, DLEN]))
        )
        if len(outside):
            i = int(outside[0])
            raise refuse(
                "start",
                i,
                f"ends past its document, which has {int(spans[i, DLEN])} tokens with BOS/EOS",
            )
        return ~here & (spans[:, LENGTH] == 0)


def resolve(saved: SavedLines, documents: DocumentLengths | None) -> tuple[list[np.ndarray], bool]:
    """The lines of ``saved`` as runtime span arrays, measured from the files: every
    span's document facts, and the length of those that run to the end of their document;
    each line's token counts checked against what was saved.

    Returns:
        The lines, and whether some spans were left to the end without a length (their
        dataset has no files here, or no ``documents`` were given): a line holding one
        cannot be materialized.

    Raises:
        StateMismatchError: A span does not fit the files, or a line's tokens differ from
            its saved counts (paths relative to the buffer).
    """
    spans = restore_spans(saved.spans)
    open_ = (spans[:, LENGTH] == 0) if documents is None else documents.fill(spans)
    n_lines, width = saved.tokens.shape
    line = np.repeat(np.arange(n_lines), np.diff(saved.offsets))
    found = np.bincount(
        line * width + spans[:, DS], weights=spans[:, LENGTH], minlength=n_lines * width
    ).reshape(n_lines, width)
    measured = np.ones(n_lines, dtype=bool)
    measured[line[open_]] = False
    bad = np.argwhere((found != saved.tokens) & measured[:, None])
    if len(bad):
        row, col = (int(v) for v in bad[0])
        raise fail(
            f"tokens[{row}][{col}]",
            f"line {row} holds {int(found[row, col])} tokens of dataset {col} by its documents' "
            f"lengths in the files, but {int(saved.tokens[row, col])} when it was saved (the "
            "documents' decoration changed since?)",
        )
    bounds = saved.offsets.tolist()
    return [spans[a:b] for a, b in zip(bounds[:-1], bounds[1:])], bool(open_.any())
