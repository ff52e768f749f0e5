"""What a packed line becomes in a batch besides its tokens: the label ignored on padding
(``IGNORE_INDEX``) and the document pieces of a line's inputs (for ``position_ids`` and
``cu_seqlens``, built per batch in ``fmsdata.transport``).
"""

from __future__ import annotations

import numpy as np

from fmsdata.stages.base import LENGTH

__all__ = ["IGNORE_INDEX", "row_segment_lengths"]

IGNORE_INDEX = -100


def row_segment_lengths(
    lines: list[np.ndarray], has_bol: bool, has_eol: bool, content: np.ndarray, seq: int
) -> tuple[np.ndarray, np.ndarray]:
    """Lengths of the document pieces of each line's *inputs* (its first ``seq`` tokens),
    for every line at once: ``(flat lengths, pieces per line)``.

    BOL joins a line's first piece and EOL its last; padding is one final piece; the
    pieces of a line sum to ``seq``. Each line gets one slot per span plus one for its
    padding, filled and adjusted with vectorized arithmetic; empty slots are dropped.
    """
    rows = len(lines)
    if rows == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    counts = np.fromiter((len(line) for line in lines), dtype=np.int64, count=rows)
    lengths = np.concatenate(lines)[:, LENGTH].astype(np.int64)
    ends = np.cumsum(counts)
    lengths[ends - counts] += has_bol
    lengths[ends - 1] += has_eol
    slots = np.zeros(len(lengths) + rows, dtype=np.int64)
    row_of = np.repeat(np.arange(rows), counts)
    slots[np.arange(len(lengths)) + row_of] = lengths
    pad_at = ends + np.arange(rows)
    content = np.asarray(content, dtype=np.int64)
    slots[pad_at] = np.maximum(seq + 1 - content, 0)
    # The inputs drop the line's last token: from the padding when there is some.
    slots[np.where(content < seq + 1, pad_at, pad_at - 1)] -= 1
    keep = slots > 0
    per_row = np.bincount(np.repeat(np.arange(rows), counts + 1)[keep], minlength=rows)
    return slots[keep], per_row
