"""The span layout lines are made of.

Everything before materialization works on *spans*, never on tokens: a span is one row
``(dataset, file, doc, start, length)`` naming ``length`` tokens of a *decorated*
document (BOS + stripped tokens + EOS) starting at ``start``. A packed line is an int64
array of spans; its tokens are read from the shard files only when the line is emitted.
That keeps buffers and saved state small however many tokens they stand for.

At run time a span carries two more columns, facts about its document found when the
document was first measured: ``dlen`` (decorated length) and ``base`` (where the
document's first kept token sits in its file's flat token buffer, -1 when the format has
none). They let lines be written without looking documents up again. Saved state keeps
the first five columns only; after a resume the writer finds the facts again (-1 = unknown).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "SPAN_WIDTH",
    "SAVED_SPAN_WIDTH",
    "DS",
    "FILE",
    "DOC",
    "START",
    "LENGTH",
    "DLEN",
    "BASE",
    "empty_spans",
    "restore_spans",
]

SAVED_SPAN_WIDTH = 5
SPAN_WIDTH = 7
DS, FILE, DOC, START, LENGTH, DLEN, BASE = range(SPAN_WIDTH)


def empty_spans() -> np.ndarray:
    return np.zeros((0, SPAN_WIDTH), dtype=np.int64)


def restore_spans(saved: np.ndarray) -> np.ndarray:
    """Runtime spans from saved ones: the document facts marked unknown (-1)."""
    spans = np.full((len(saved), SPAN_WIDTH), -1, dtype=np.int64)
    spans[:, :SAVED_SPAN_WIDTH] = saved
    return spans
