"""Turn lines of spans into token rows, reading only the slices the spans name.

All spans of a batch part are handled together: where each piece lands, and the BOS/EOS/
BOL/EOL/pad tokens, come from vectorized arithmetic on the span columns; the only
per-span Python work left is one slice copy from the document's memory-mapped tokens.
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


class LineWriter:
    """Writes packed lines ``[BOL] documents... [EOL] [pad...]`` into int64 rows.

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

    def write(self, lines: Sequence[np.ndarray], out: np.ndarray) -> np.ndarray:
        """Fill row ``k`` of ``out`` from ``lines[k]``; return the non-pad token count per row."""
        n_rows, width = out.shape
        if n_rows == 0:
            return np.zeros(0, dtype=np.int64)
        counts = np.fromiter((len(line) for line in lines), dtype=np.int64, count=n_rows)
        spans = np.concatenate(lines)
        if (spans[:, DLEN] < 0).any():
            self._find_facts(spans)
        row = np.repeat(np.arange(n_rows), counts)

        bos, eos = self.decoration.bos, self.decoration.eos
        has_bos, has_eos = int(bos is not None), int(eos is not None)
        content = spans[:, DLEN] - has_bos - has_eos
        start = spans[:, START]
        end = start + spans[:, LENGTH]
        with_bos = ((start == 0) & bool(has_bos)).astype(np.int64)
        first = start - has_bos + with_bos  # first content token of the span
        n_copy = np.maximum(np.minimum(end - has_bos, content) - first, 0)
        with_eos = ((end - has_bos > content) & bool(has_eos)).astype(np.int64)
        written = with_bos + n_copy + with_eos

        head = int(self.bol is not None)
        before = np.cumsum(written) - written
        row_first = np.cumsum(counts) - counts
        base = row * width + head + before - np.repeat(before[row_first], counts)
        flat_out = out.reshape(-1)
        if head:
            out[:, 0] = self.bol
        if has_bos:
            flat_out[base[with_bos == 1]] = bos
        if has_eos:
            flat_out[(base + with_bos + n_copy)[with_eos == 1]] = eos
        self._copy(spans, flat_out, base + with_bos, first, n_copy)

        fill = np.bincount(row, weights=written, minlength=n_rows).astype(np.int64) + head
        if self.eol is not None:
            out[np.arange(n_rows), fill] = self.eol
            fill += 1
        if (fill < width).any():
            if self.pad is None:
                raise AssertionError(f"hard-packed lines came out short: {fill.tolist()} < {width}")
            out[np.arange(width)[None, :] >= fill[:, None]] = self.pad
        if self.vocab_size is not None:
            self._check_vocab(spans, out)
        return fill

    def _copy(
        self, spans: np.ndarray, flat_out: np.ndarray, dst: np.ndarray, first: np.ndarray, n_copy: np.ndarray
    ) -> None:
        """Copy each span's document tokens; one slice copy per span.

        The loop walks span metadata (a few integers per document), never tokens.
        """
        buffers: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        strip = self.decoration.strip
        # Copying between equal dtypes is a plain memcpy; int32 rows are written through a
        # same-width view when the shard's tokens are uint32 (values of 2**31 and above
        # then read as negative and are caught by the caller's range check).
        views = {flat_out.dtype: flat_out}
        if flat_out.dtype == np.int32:
            views[np.dtype(np.uint32)] = flat_out.view(np.uint32)
        copy = np.flatnonzero(n_copy)
        for ds, file, doc, base, d, s, n in zip(
            spans[copy, DS].tolist(),
            spans[copy, FILE].tolist(),
            spans[copy, DOC].tolist(),
            spans[copy, BASE].tolist(),
            dst[copy].tolist(),
            first[copy].tolist(),
            n_copy[copy].tolist(),
        ):
            if base >= 0:
                found = buffers.get((ds, file))
                if found is None:
                    access = self.accesses[ds]
                    flat = access.handler.token_buffer(access.reader(file))[0]
                    found = buffers[ds, file] = (flat, views.get(flat.dtype, flat_out))
                flat, target = found
                piece = flat[base + s : base + s + n]
                if piece.dtype.itemsize > 4 and len(piece) and (piece.max() > _INT32_MAX or piece.min() < 0):
                    raise ShardFormatError(
                        f"{self.accesses[ds].path(file)}: document {doc} holds a token id outside "
                        f"[0, 2**31): {int(piece.max())}"
                    )
                target[d : d + n] = piece
            else:
                access = self.accesses[ds]
                handler = access.handler
                tokens = handler.get(access.reader(file), doc)
                lead = int(bool(strip) and len(tokens) > 0 and int(tokens[0]) in strip)
                flat_out[d : d + n] = handler.slice(tokens, lead + s, n)

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
        if int(tokens.min()) >= 0 and int(tokens.max()) < self.vocab_size:
            return
        for row in spans:
            access = self.accesses[int(row[DS])]
            doc = access.handler.get(access.reader(int(row[FILE])), int(row[DOC]))
            bad = doc[(doc < 0) | (doc >= self.vocab_size)]
            if bad.size:
                raise ShardFormatError(
                    f"{access.path(int(row[FILE]))}: document {int(row[DOC])} holds token id "
                    f"{int(bad[0])}, outside vocab_size={self.vocab_size}"
                )
        raise ShardFormatError(
            f"a line holds a token id outside vocab_size={self.vocab_size} "
            "(a bos/eos/bol/eol/pad token in the config is too large)"
        )
