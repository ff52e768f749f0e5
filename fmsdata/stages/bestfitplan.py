"""Best-fit-decreasing packing of documents into lines, one window of documents at a time.

The rule (``packing: best_fit``; the stage that runs it is ``fmsdata.stages.bestfit``):

- Documents come in *windows* of ``window`` consecutive documents of the source.
- A document longer than a line is cut into line-sized pieces from its start: each full
  piece is a line of its own, and the rest (at most a line) is placed as a document. No
  other document is ever cut.
- The window's documents (and rests) are placed in decreasing length (ties: the earlier
  document first), each into the open line with the least room that still holds it (ties:
  the line opened first), or into a new line when none does.
- After the window is placed, the lines that are full and the lines carried in from the
  window before are *emitted*; the lines opened in this window that still have room stay
  open for the next window. So a line holds documents of at most two consecutive windows
  and stays open for at most two windows: that is the bound on how far a document moves
  and on what the state holds.
- Emitted lines come in the order of their earliest document in the source (lines carried
  in first, in their order; a long document's full pieces before the line holding its
  rest), each line's pieces in source order (pieces carried in first). Open lines are kept
  in that order too: it is the order they are saved in, and a window's placement depends
  only on (open lines in that order, the window's documents).

Everything is one compiled pass (``plan_best_fit``) over as many whole windows as the
packer has read ahead; it runs as the same Python while numba compiles it
(``fmsdata.util.compiled``) and gives the same result either way.
"""

from __future__ import annotations

import numpy as np

from fmsdata.stages.spans import LENGTH, START
from fmsdata.util.compiled import compiled

__all__ = ["plan_best_fit", "STAT_LINES", "STAT_PADDING", "STAT_PIECES", "STAT_CUT"]

# Columns of the per-window figures ``plan_best_fit`` returns.
STAT_LINES, STAT_PADDING, STAT_PIECES, STAT_CUT = range(4)


@compiled
def _find_slot(slots, n_slots, least):  # type: ignore[no-untyped-def]
    """The first of ``slots[:n_slots]`` (ascending) that is at least ``least``
    (``n_slots`` when none is)."""
    lo, hi = 0, n_slots
    while lo < hi:
        mid = (lo + hi) // 2
        if slots[mid] < least:
            lo = mid + 1
        else:
            hi = mid
    return lo


@compiled
def _put_slot(slots, n_slots, value):  # type: ignore[no-untyped-def]
    """Insert ``value`` into ascending ``slots[:n_slots]``; returns the new count."""
    at = _find_slot(slots, n_slots, value)
    for k in range(n_slots, at, -1):
        slots[k] = slots[k - 1]
    slots[at] = value
    return n_slots + 1


@compiled
def plan_best_fit(open_rows, open_offsets, docs, window, capacity):  # type: ignore[no-untyped-def]
    """Place ``docs`` window by window (the module docstring's rule).

    Args:
        open_rows: ``[pieces, SPAN_WIDTH]`` int64: the pieces of the lines open before the
            first window, line after line, each line's pieces in order.
        open_offsets: ``[lines + 1]`` bounds of those lines in ``open_rows``.
        docs: ``[windows * window, SPAN_WIDTH]`` int64: the documents, in source order
            (``START``/``LENGTH``: the part to place, usually the whole document).
        window: Documents per window.
        capacity: Document tokens a line holds.

    Returns:
        ``(spans, offsets, window_lines, open_spans, open_offsets, window_open, stats)``:
        the emitted lines (line ``j`` is ``spans[offsets[j]:offsets[j + 1]]``), window
        ``w``'s emitted lines ``window_lines[w] .. window_lines[w + 1] - 1``; the lines
        open after each window (as ``open_spans``/``open_offsets``, window ``w``'s
        ``window_open[w] .. window_open[w + 1] - 1``); per window (``[windows, 4]``):
        lines emitted, their padding tokens, their pieces, documents cut (``STAT_*``).
    """
    width = docs.shape[1]
    n_windows = docs.shape[0] // window
    n_docs = n_windows * window
    n_full = 0
    for i in range(n_docs):
        if docs[i, LENGTH] > capacity:
            n_full += (docs[i, LENGTH] - 1) // capacity
    n_open0 = open_offsets.shape[0] - 1
    # Bounds: every piece is an open piece carried in, a document (or rest), or a full
    # piece; a window's lines are its carried lines, one per document and one per full
    # piece; what a window leaves open holds only its own documents.
    most_lines = max(n_open0, window) + window + n_full + 1
    most_pieces = max(open_rows.shape[0], window) + window + n_full + 1
    spans = np.empty((open_rows.shape[0] + n_docs + n_full, width), np.int64)
    offsets = np.zeros(open_rows.shape[0] + n_docs + n_full + 1, np.int64)
    window_lines = np.zeros(n_windows + 1, np.int64)
    open_spans = np.empty((n_docs, width), np.int64)
    open_offsets_out = np.zeros(n_docs + 1, np.int64)
    window_open = np.zeros(n_windows + 1, np.int64)
    stats = np.zeros((n_windows, 4), np.int64)

    room = np.empty(most_lines, np.int64)
    key = np.empty(most_lines, np.int64)
    rank = np.empty(most_lines, np.int64)
    slots = np.empty(most_lines, np.int64)
    pieces = np.empty((most_pieces, width), np.int64)
    piece_line = np.empty(most_pieces, np.int64)
    piece_order = np.empty(most_pieces, np.int64)
    item_length = np.empty(window, np.int64)
    item_pos = np.empty(window, np.int64)
    item_start = np.empty(window, np.int64)

    carried_rows = open_rows
    carried_offsets = open_offsets
    n_lines_out = 0
    n_spans_out = 0
    n_open_lines = 0
    n_open_spans = 0
    for w in range(n_windows):
        base = w * window
        n_carried = carried_offsets.shape[0] - 1
        n_carried_pieces = carried_rows.shape[0]
        n_pieces = 0
        n_slots = 0
        for line in range(n_carried):
            fill = 0
            for r in range(carried_offsets[line], carried_offsets[line + 1]):
                for c in range(width):
                    pieces[n_pieces, c] = carried_rows[r, c]
                piece_line[n_pieces] = line
                piece_order[n_pieces] = r
                fill += carried_rows[r, LENGTH]
                n_pieces += 1
            room[line] = capacity - fill
            key[line] = line - n_carried  # before every document of this window, in order
            if room[line] > 0:
                n_slots = _put_slot(slots, n_slots, room[line] * most_lines + line)
        n_lines = n_carried
        # Cut what is longer than a line: full pieces are lines of their own.
        n_items = 0
        cut = 0
        for p in range(window):
            row = base + p
            length = docs[row, LENGTH]
            start = docs[row, START]
            if length <= 0:
                continue
            if length > capacity:
                cut += 1
            while length > capacity:
                for c in range(width):
                    pieces[n_pieces, c] = docs[row, c]
                pieces[n_pieces, START] = start
                pieces[n_pieces, LENGTH] = capacity
                piece_line[n_pieces] = n_lines
                piece_order[n_pieces] = n_carried_pieces + p
                n_pieces += 1
                room[n_lines] = 0
                key[n_lines] = p
                n_lines += 1
                start += capacity
                length -= capacity
            item_length[n_items] = length
            item_pos[n_items] = p
            item_start[n_items] = start
            n_items += 1
        # Decreasing length, the earlier document first among equals (the keys are unique).
        order_key = np.empty(n_items, np.int64)
        for k in range(n_items):
            order_key[k] = (capacity - item_length[k]) * (window + 1) + item_pos[k]
        for k in np.argsort(order_key):
            length = item_length[k]
            p = item_pos[k]
            at = _find_slot(slots, n_slots, length * most_lines)
            if at < n_slots:  # the least room that holds it, the earliest line among equals
                line = slots[at] % most_lines
                for s in range(at, n_slots - 1):
                    slots[s] = slots[s + 1]
                n_slots -= 1
                room[line] -= length
                if p < key[line]:
                    key[line] = p
            else:
                line = n_lines
                n_lines += 1
                room[line] = capacity - length
                key[line] = p
            if room[line] > 0:
                n_slots = _put_slot(slots, n_slots, room[line] * most_lines + line)
            for c in range(width):
                pieces[n_pieces, c] = docs[base + p, c]
            pieces[n_pieces, START] = item_start[k]
            pieces[n_pieces, LENGTH] = length
            piece_line[n_pieces] = line
            piece_order[n_pieces] = n_carried_pieces + p
            n_pieces += 1
        # Emitted: the lines carried in and the full ones; the rest stay open. Each group
        # in order of its earliest document (then of opening).
        line_key = np.empty(n_lines, np.int64)
        for line in range(n_lines):
            line_key[line] = (key[line] + n_carried) * most_lines + line
        by_key = np.argsort(line_key)
        n_emitted = 0
        for line in by_key:
            if line < n_carried or room[line] == 0:
                rank[line] = n_emitted
                n_emitted += 1
        n_staying = 0
        for line in by_key:
            if not (line < n_carried or room[line] == 0):
                rank[line] = n_emitted + n_staying
                n_staying += 1
        most_order = n_carried_pieces + window + 1
        piece_key = np.empty(n_pieces, np.int64)
        for q in range(n_pieces):
            piece_key[q] = rank[piece_line[q]] * most_order + piece_order[q]
        line_pieces = np.zeros(n_lines, np.int64)
        padding = 0
        emitted_pieces = 0
        first_open_span = n_open_spans
        first_open_line = n_open_lines
        for q in np.argsort(piece_key):
            line = piece_line[q]
            line_pieces[rank[line]] += 1
            if rank[line] < n_emitted:
                for c in range(width):
                    spans[n_spans_out, c] = pieces[q, c]
                n_spans_out += 1
                emitted_pieces += 1
            else:
                for c in range(width):
                    open_spans[n_open_spans, c] = pieces[q, c]
                n_open_spans += 1
        window_lines[w] = n_lines_out
        for j in range(n_emitted):
            offsets[n_lines_out + 1] = offsets[n_lines_out] + line_pieces[j]
            n_lines_out += 1
        for line in range(n_lines):
            if rank[line] < n_emitted:
                padding += room[line]
        window_open[w] = n_open_lines
        for j in range(n_emitted, n_emitted + n_staying):
            open_offsets_out[n_open_lines + 1] = open_offsets_out[n_open_lines] + line_pieces[j]
            n_open_lines += 1
        stats[w, 0] = n_emitted
        stats[w, 1] = padding
        stats[w, 2] = emitted_pieces
        stats[w, 3] = cut
        carried_rows = open_spans[first_open_span:n_open_spans]
        carried_offsets = open_offsets_out[first_open_line : n_open_lines + 1] - first_open_span
    window_lines[n_windows] = n_lines_out
    window_open[n_windows] = n_open_lines
    return (
        spans[:n_spans_out],
        offsets[: n_lines_out + 1],
        window_lines,
        open_spans[:n_open_spans],
        open_offsets_out[: n_open_lines + 1],
        window_open,
        stats,
    )
