"""Turn lines of spans into token rows, reading only the slices the spans name.

All spans of a batch part are handled together: where each span lands and where the
BOS/EOS/BOL/EOL/pad tokens go come from vectorized arithmetic on the span columns (the
delimiters are placed with one scatter each). Tokens are copied from the documents'
memory-mapped buffers one slice per long span and one vectorized gather per file for the
short ones, so short documents cost no per-span Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fmsdata.errors import ShardFormatError
from fmsdata.stages.base import BASE, DLEN, DOC, DS, FILE, LENGTH, START
from fmsdata.stages.documents import Decoration

__all__ = ["LineWriter"]

_INT32_MAX = 2**31 - 1
# Spans at least this long are copied one slice each (a memcpy beats an index gather);
# shorter ones are gathered per file in one vectorized operation.
_SLICE_MIN = 256


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])``, vectorized.

    ``lengths`` must be positive.
    """
    steps = np.ones(int(lengths.sum()), dtype=np.int64)
    steps[0] = starts[0]
    heads = np.cumsum(lengths[:-1])
    steps[heads] = starts[1:] - (starts[:-1] + lengths[:-1]) + 1
    return np.cumsum(steps, out=steps)


def _check_int32(piece: np.ndarray, access: Any, file: int, doc: int) -> None:
    """Rows are int32: refuse token ids that do not fit (64-bit token files only)."""
    if (
        piece.dtype.itemsize > 4
        and len(piece)
        and (int(piece.max()) > _INT32_MAX or int(piece.min()) < 0)
    ):
        raise ShardFormatError(
            f"{access.path(file)}: document {doc} holds a token id outside [0, 2**31): "
            f"{int(piece.max()) if int(piece.max()) > _INT32_MAX else int(piece.min())}"
        )


class LineWriter:
    """Writes packed lines ``[BOL] documents... [EOL] [pad...]`` into int32 rows.

    Args:
        accesses: Dataset accesses by dataset index (the ``ds`` field of spans).
        decoration: BOS/EOS/stripping applied to documents.
        line_length: Tokens per line.
        bol, eol: Line delimiters or None.
        pad: Padding token (pad packing) or None.
        vocab_size: When set, token ids outside ``[0, vocab_size)`` raise ShardFormatError.
    """

    def __init__(
        self,
        accesses: Sequence[Any],
        decoration: Decoration,
        line_length: int,
        bol: int | None = None,
        eol: int | None = None,
        pad: int | None = None,
        vocab_size: int | None = None,
    ):
        self.accesses = list(accesses)
        self.decoration = decoration
        self.line_length = line_length
        self.bol = bol
        self.eol = eol
        self.pad = pad
        self.vocab_size = vocab_size
        self.slice_min = _SLICE_MIN
        self._first_file: np.ndarray | None = None  # each dataset's first dense file number

    def fingerprint(self) -> dict[str, Any]:
        """What the rows depend on besides the spans, as stage fingerprints give it (the
        vocabulary is a check and changes no row)."""
        return {
            "path": None,
            "stage": f"{type(self).__module__}.{type(self).__qualname__}",
            "role": "materialize",
            "settings": {
                "line_length": self.line_length,
                "bol": self.bol,
                "eol": self.eol,
                "pad": self.pad,
            },
        }

    def write(self, lines: Sequence[np.ndarray], out: np.ndarray) -> np.ndarray:
        """Fill row ``k`` of ``out`` from ``lines[k]``; return the non-pad token count per row."""
        n_rows, width = out.shape
        if n_rows == 0:
            return np.zeros(0, dtype=np.int64)
        counts = np.fromiter((len(line) for line in lines), dtype=np.int64, count=n_rows)
        spans = np.concatenate(lines)
        if (spans[:, DLEN] < 0).any():
            self._find_facts(spans)

        bos, eos = self.decoration.bos, self.decoration.eos
        has_bos, has_eos = int(bos is not None), int(eos is not None)
        content = spans[:, DLEN] - has_bos - has_eos
        start = spans[:, START]
        end = start + spans[:, LENGTH]
        with_bos = (start == 0) & bool(has_bos)
        first = start - has_bos + with_bos  # first content token of the span
        n_copy = np.maximum(np.minimum(end - has_bos, content) - first, 0)
        with_eos = (end - has_bos > content) & bool(has_eos)
        row = np.repeat(np.arange(n_rows), counts)
        written = with_bos + n_copy + with_eos
        fill = np.bincount(row, weights=written, minlength=n_rows).astype(np.int64)
        fill += (self.bol is not None) + (self.eol is not None)
        if self.pad is None and (fill != width).any():
            raise ShardFormatError(
                f"hard-packed lines came out as {fill.tolist()} tokens, not {width}: their "
                "spans name more tokens than the documents hold now (the files changed since "
                "the spans were made) or a stage changed the lines' spans"
            )

        # Where each span's first token lands in the flattened rows.
        head = int(self.bol is not None)
        before = np.cumsum(written) - written
        row_first = np.cumsum(counts) - counts
        at = row * width + head + before - np.repeat(before[row_first], counts)
        flat_out = out.reshape(-1)
        if head:
            out[:, 0] = self.bol
        if has_bos:
            flat_out[at[with_bos]] = bos
        if has_eos:
            flat_out[(at + with_bos + n_copy)[with_eos]] = eos
        if self.eol is not None:
            out[np.arange(n_rows), fill - 1] = self.eol
        if self.pad is not None and (fill < width).any():
            out[np.arange(width)[None, :] >= fill[:, None]] = self.pad
        self._copy(spans, flat_out, at + with_bos, first, n_copy)
        if self.vocab_size is not None:
            self._check_vocab(spans, out)
        return fill

    def _copy(
        self,
        spans: np.ndarray,
        flat_out: np.ndarray,
        dst: np.ndarray,
        first: np.ndarray,
        n_copy: np.ndarray,
    ) -> None:
        """Copy each span's tokens into place.

        Long spans are one slice copy each (a memcpy; the loop walks span metadata, never
        tokens). Short spans, where the per-span Python cost would dominate, are gathered
        per file in one vectorized operation: index arrays for source and destination,
        built with ``np.repeat``/``cumsum``.
        """
        keys, group = self._files(spans)
        sources = [self._source(*key) for key in keys]
        # Copies between equal dtypes are plain memcpy: int32 rows take uint32 tokens through
        # a same-width view (ids of 2**31 and above then read as negative; the caller checks).
        views = {flat_out.dtype: flat_out, np.dtype(np.uint32): flat_out.view(np.uint32)}
        targets = [
            views.get(source[0].dtype, flat_out) if source[0] is not None else flat_out
            for source in sources
        ]
        slow = (spans[:, BASE] < 0) | np.array([source[3] for source in sources], dtype=bool)[group]
        src = first + spans[:, BASE]
        fast = ~slow & (n_copy > 0)
        long = np.flatnonzero(fast & (n_copy >= self.slice_min))
        for g, d, s, n in zip(
            group[long].tolist(), dst[long].tolist(), src[long].tolist(), n_copy[long].tolist()
        ):
            targets[g][d : d + n] = sources[g][0][s : s + n]
        short = np.flatnonzero(fast & (n_copy < self.slice_min))
        if short.size:
            short = short[np.argsort(group[short], kind="stable")]
            lengths = n_copy[short]
            into = _ranges(dst[short], lengths)
            take = _ranges(src[short], lengths)
            ends = np.cumsum(lengths)
            cuts = np.searchsorted(group[short], np.arange(len(sources) + 1))
            for g in np.flatnonzero(np.diff(cuts)).tolist():
                a = int(ends[cuts[g] - 1]) if cuts[g] else 0
                b = int(ends[cuts[g + 1] - 1])
                targets[g][into[a:b]] = sources[g][0][take[a:b]]
        for i in np.flatnonzero(slow & (n_copy > 0)).tolist():
            n = int(n_copy[i])
            piece = self._slow_piece(spans[i], sources[group[i]], int(first[i]), n)
            flat_out[int(dst[i]) : int(dst[i]) + n] = piece

    def _files(self, spans: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray]:
        """The ``(dataset, file)`` pairs the spans read, and each span's index into them:
        files numbered densely across datasets, so grouping is a bincount, not a sort."""
        if self._first_file is None:
            counts = [access.num_files for access in self.accesses]
            self._first_file = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        first = self._first_file
        global_file = first[spans[:, DS]] + spans[:, FILE]
        used = np.flatnonzero(np.bincount(global_file, minlength=int(first[-1])))
        number = np.zeros(int(first[-1]), dtype=np.int64)
        number[used] = np.arange(len(used))
        ds = np.searchsorted(first, used, side="right") - 1
        keys = list(zip(ds.tolist(), (used - first[ds]).tolist()))
        return keys, number[global_file]

    def _slow_piece(self, span: np.ndarray, source: tuple, first: int, n: int) -> np.ndarray:
        """A span's tokens through the handler: formats without a flat token buffer, and
        64-bit token files (whose values must be checked to fit int32 rows)."""
        flat, access, file, _ = source
        doc = int(span[DOC])
        if flat is not None and span[BASE] >= 0:
            at = int(span[BASE]) + first
            piece = flat[at : at + n]
        else:
            strip = self.decoration.strip
            tokens = access.handler.get(access.reader(file), doc)
            lead = int(bool(strip) and len(tokens) > 0 and int(tokens[0]) in strip)
            piece = access.handler.slice(tokens, lead + first, n)
        _check_int32(piece, access, file, doc)
        return piece

    def _source(self, ds: int, file: int) -> tuple[np.ndarray | None, Any, int, bool]:
        """(flat token buffer or None, access, file, whether pieces need a range check)."""
        access = self.accesses[ds]
        buffer = access.handler.token_buffer(access.reader(file))
        flat = None if buffer is None else buffer[0]
        wide = flat is None or flat.dtype.itemsize > 4
        return flat, access, file, wide

    def _find_facts(self, spans: np.ndarray) -> None:
        """Fill in ``dlen`` and ``base`` of spans restored from a saved state."""
        unknown = np.flatnonzero(spans[:, DLEN] < 0)
        decoration = self.decoration
        for i in unknown.tolist():
            ds, file, doc = (int(v) for v in spans[i, [DS, FILE, DOC]])
            access = self.accesses[ds]
            docs = np.array([doc], dtype=np.int64)
            lengths, lead, trail, starts = access.measure(file, docs, decoration)
            spans[i, DLEN] = int(lengths[0] - lead[0] - trail[0]) + decoration.extra
            spans[i, BASE] = int(starts[0] + lead[0]) if starts is not None else -1

    def _check_vocab(self, spans: np.ndarray, tokens: np.ndarray) -> None:
        vocab = self.vocab_size
        assert vocab is not None, "only called with a vocabulary"
        if int(tokens.min()) >= 0 and int(tokens.max()) < vocab:
            return
        for row in spans:
            access = self.accesses[int(row[DS])]
            doc = access.handler.get(access.reader(int(row[FILE])), int(row[DOC]))
            bad = doc[(doc < 0) | (doc >= vocab)]
            if bad.size:
                raise ShardFormatError(
                    f"{access.path(int(row[FILE]))}: document {int(row[DOC])} holds token id "
                    f"{int(bad[0])}, outside vocab_size={vocab}"
                )
        raise ShardFormatError(
            f"a line holds a token id outside vocab_size={vocab} "
            "(a bos/eos/bol/eol/pad token in the config is too large)"
        )
