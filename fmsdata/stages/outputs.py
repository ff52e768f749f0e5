"""What a packed line becomes in a batch besides its tokens: the label ignored on padding
(``IGNORE_INDEX``), the document pieces of a line (``TokenLine``: what token-level stages
see and change), and from them the per-batch ``position_ids``, ``cu_seqlens`` and
``document_ids`` (built in ``fmsdata.transport.items``).

A *document id* names the source document of a token: ``dataset << 56 | file << 32 |
doc``, where ``dataset`` is the dataset's index in the config's ``datasets`` order,
``file`` the file's index in the dataset's sorted file list, and ``doc`` the document's
index inside the file (``split_document_id`` takes one apart). It is the same in every
line a document's pieces land in, on every rank and world size. Padding has id -1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from fmsdata.errors import ShardFormatError
from fmsdata.stages.lineblock import LineBlock, as_block
from fmsdata.stages.spans import DOC, DS, FILE, LENGTH

__all__ = [
    "IGNORE_INDEX",
    "PAD_DOCUMENT_ID",
    "TokenLine",
    "document_ids_of",
    "split_document_id",
    "row_segment_lengths",
    "span_pieces",
    "piece_segment_lengths",
]

IGNORE_INDEX = -100
PAD_DOCUMENT_ID = -1
_DS_SHIFT, _FILE_SHIFT = 56, 32


def document_ids_of(spans: np.ndarray) -> np.ndarray:
    """The document id of each span (see the module docstring)."""
    ds, file, doc = spans[:, DS], spans[:, FILE], spans[:, DOC]
    if len(spans) and (int(ds.max()) >= 128 or int(file.max()) >= 1 << 24 or doc.max() >= 1 << 32):
        raise ShardFormatError(
            "document ids hold at most 128 datasets, 2**24 files per dataset and 2**32 "
            f"documents per file; a line names dataset {int(ds.max())}, file {int(file.max())}, "
            f"document {int(doc.max())}"
        )
    return (ds << _DS_SHIFT) | (file << _FILE_SHIFT) | doc


def split_document_id(ids: np.ndarray | int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dataset, file, doc) of document ids."""
    ids = np.asarray(ids, dtype=np.int64)
    return ids >> _DS_SHIFT, (ids >> _FILE_SHIFT) & ((1 << 24) - 1), ids & ((1 << 32) - 1)


@dataclasses.dataclass
class TokenLine:
    """One materialized line as token-level stages see it, besides its tokens.

    Attributes:
        spans: The line's spans (read only: which documents the line was packed from).
        pieces: Token count of each document piece of the line's content, in order; the
            line's BOL joins the first piece and its EOL the last, so they sum to the
            content count. A stage that moves, adds or drops tokens sets them anew.
        ids: The document id of each piece (``pieces`` and ``ids`` have one entry each
            per piece).
    """

    spans: np.ndarray
    pieces: np.ndarray
    ids: np.ndarray

    @staticmethod
    def of(spans: np.ndarray, has_bol: bool, has_eol: bool) -> TokenLine:
        pieces = spans[:, LENGTH].copy()
        if len(pieces):
            pieces[0] += has_bol
            pieces[-1] += has_eol
        return TokenLine(spans, pieces, document_ids_of(spans))


def row_segment_lengths(
    lines: Sequence[np.ndarray] | LineBlock,
    has_bol: bool,
    has_eol: bool,
    content: np.ndarray,
    seq: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Lengths of the document pieces of each line's *inputs* (its first ``seq`` tokens),
    for every line at once, from the lines' spans: ``(flat lengths, pieces per line)``.

    BOL joins a line's first piece and EOL its last; padding is one final piece; the
    pieces of a line sum to ``seq``.
    """
    lengths, counts = span_pieces(lines, has_bol, has_eol)
    flat, per_row, _ = piece_segment_lengths(lengths, counts, content, seq)
    return flat, per_row


def span_pieces(
    lines: Sequence[np.ndarray] | LineBlock, has_bol: bool, has_eol: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Every line's piece lengths, flat, and the pieces per line (BOL/EOL joined)."""
    block = as_block(lines)
    counts = block.counts
    if not len(block):
        return np.zeros(0, dtype=np.int64), counts
    lengths = block.spans[:, LENGTH].copy()
    ends = block.offsets[1:]
    lengths[ends - counts] += has_bol
    lengths[ends - 1] += has_eol
    return lengths, counts


def piece_segment_lengths(
    lengths: np.ndarray,
    counts: np.ndarray,
    content: np.ndarray,
    seq: int,
    ids: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The pieces of every line's inputs, given each line's pieces (``lengths`` flat,
    ``counts`` per line, summing to the line's ``content``) and optionally their document
    ids: ``(flat lengths, pieces per line, flat ids or None)``, padding one final piece
    of id ``PAD_DOCUMENT_ID``. Each line gets one slot per piece plus one for its
    padding, filled and adjusted with vectorized arithmetic; empty slots are dropped.
    """
    rows = len(counts)
    if rows == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, (empty if ids is not None else None)
    ends = np.cumsum(counts)
    slots = np.zeros(len(lengths) + rows, dtype=np.int64)
    row_of = np.repeat(np.arange(rows), counts)
    at = np.arange(len(lengths)) + row_of
    slots[at] = lengths
    pad_at = ends + np.arange(rows)
    content = np.asarray(content, dtype=np.int64)
    slots[pad_at] = np.maximum(seq + 1 - content, 0)
    # The inputs drop the line's last token: from the padding when there is some, else
    # from the line's last non-empty piece.
    last = pad_at.copy()
    full = content >= seq + 1
    if full.any():
        nonempty = np.flatnonzero(slots > 0)
        # The last non-empty slot before each full line's padding slot.
        last[full] = nonempty[np.searchsorted(nonempty, pad_at[full]) - 1]
    slots[last] -= 1
    keep = slots > 0
    per_row = np.bincount(np.repeat(np.arange(rows), counts + 1)[keep], minlength=rows)
    out_ids = None
    if ids is not None:
        slot_ids = np.full(len(slots), PAD_DOCUMENT_ID, dtype=np.int64)
        slot_ids[at] = ids
        out_ids = slot_ids[keep]
    return slots[keep], per_row, out_ids
