"""Compiled loops (numba) for the per-token and per-span work of a worker.

What numpy cannot do without per-token index arrays or dozens of passes over the spans is
done here in one compiled pass: laying lines out (``fmsdata.worker.materialize``; their
pieces are copied by ``fmsdata.transport.batchwrite.copy_spans``, beside the batch writing it
feeds), and splitting a run of documents into hard-packed lines
(``fmsdata.stages.packing``). There is one code path: these kernels are the
implementation, not an accelerated copy of a numpy one.

Each kernel is compiled on its first call and cached on disk (``fmsdata.util.compiled`` says
where, and what happens when the cache cannot be written).
"""

from __future__ import annotations

import numpy as np

from fmsdata.stages.spans import DLEN, LENGTH, START
from fmsdata.util.compiled import compiled

__all__ = ["lay_out_lines", "plan_hard_lines"]


@compiled
def lay_out_lines(
    spans: np.ndarray,
    counts: np.ndarray,
    out: np.ndarray,
    bol: int,
    eol: int,
    pad: int,
    bos: int,
    eos: int,
    dst: np.ndarray,
    first: np.ndarray,
    n_copy: np.ndarray,
) -> np.ndarray:
    """Write each row's delimiters and padding, and say where each span's tokens go.

    Row ``r`` of ``out`` is ``[bol] pieces of counts[r] spans [eol] [pad...]``; a span is
    ``[bos] document tokens [eos]`` cut to its ``start``/``length`` (``dlen`` counts the
    decorated document; an empty span writes nothing). A delimiter argument below 0 means
    none. Fills ``dst`` (flat index into ``out`` of the span's first document token),
    ``first`` (index of that token in the stripped document) and ``n_copy`` (document
    tokens to copy), and returns the tokens each row holds before padding. Nothing is
    written past a row's end: a row whose spans name more tokens than it holds comes back
    with a fill above the row width.
    """
    n_rows, width = out.shape
    has_bos = 1 if bos >= 0 else 0
    has_eos = 1 if eos >= 0 else 0
    fill = np.empty(n_rows, np.int64)
    i = 0
    for r in range(n_rows):
        at = 0
        if bol >= 0:
            if width > 0:
                out[r, 0] = bol
            at = 1
        for _ in range(counts[r]):
            content = spans[i, DLEN] - has_bos - has_eos
            start = spans[i, START]
            length = spans[i, LENGTH]
            end = start + length
            begin = start - has_bos if start > 0 else 0
            if has_bos and start == 0 and length > 0:
                if at < width:
                    out[r, at] = bos
                at += 1
            n = min(end - has_bos, content) - begin
            if n < 0:
                n = 0
            dst[i] = r * width + at
            first[i] = begin
            n_copy[i] = n
            at += n
            if has_eos and length > 0 and end - has_bos > content:
                if at < width:
                    out[r, at] = eos
                at += 1
            i += 1
        if eol >= 0:
            if at < width:
                out[r, at] = eol
            at += 1
        fill[r] = at
        if pad >= 0:
            for c in range(at, width):
                out[r, c] = pad
    return fill


@compiled
def plan_hard_lines(
    rows: np.ndarray, capacity: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cut a run of span rows into lines of exactly ``capacity`` tokens, in one pass.

    ``rows`` holds spans (document pieces, the first may be a carried remainder) back to
    back; only whole lines are cut (``sum(lengths) // capacity`` of them). Returns
    ``(spans, offsets, first_line, carries)``: the lines' spans (line ``j`` is
    ``spans[offsets[j]:offsets[j + 1]]``), the line each row starts in, and per line the
    remainder of the row cut at its end (a zero row where no row is cut there).
    """
    width = rows.shape[1]
    total = 0
    for r in range(rows.shape[0]):
        total += rows[r, LENGTH]
    n_lines = total // capacity
    n_spans = 0
    at = 0
    for r in range(rows.shape[0]):  # pieces: one per line a row touches within n_lines
        length = rows[r, LENGTH]
        if length > 0 and at < n_lines * capacity:
            last = min(at + length, n_lines * capacity) - 1
            n_spans += last // capacity - at // capacity + 1
        at += length
    spans = np.empty((n_spans, width), np.int64)
    offsets = np.zeros(n_lines + 1, np.int64)
    first_line = np.empty(rows.shape[0], np.int64)
    carries = np.zeros((n_lines, width), np.int64)
    at = 0
    k = 0
    for r in range(rows.shape[0]):
        length = rows[r, LENGTH]
        first_line[r] = at // capacity
        done = 0
        while done < length and at < n_lines * capacity:
            line = at // capacity
            take = min(length - done, (line + 1) * capacity - at)
            for c in range(width):
                spans[k, c] = rows[r, c]
            spans[k, START] = rows[r, START] + done
            spans[k, LENGTH] = take
            k += 1
            done += take
            at += take
            offsets[line + 1] = k
            if at == (line + 1) * capacity and done < length:
                for c in range(width):
                    carries[line, c] = rows[r, c]
                carries[line, START] = rows[r, START] + done
                carries[line, LENGTH] = length - done
        at += length - done
    return spans, offsets, first_line, carries
