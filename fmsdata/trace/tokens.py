"""The tokens of a traced row, and of a global step as each rank received it.

A row's tokens are its parts' (stored tokens read from the data, inserted ones by id); its
``input_ids`` and ``labels`` follow the causal-LM shift of
``fmsdata.transport.batchwrite``: inputs are the row less its last token, labels the row
less its first, ``IGNORE_INDEX`` from the last content token on and for the first
``ignore_first_labels`` of every row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fmsdata.stages.outputs import IGNORE_INDEX
from fmsdata.trace.rows import LineTracer, RowTrace

__all__ = ["row_tokens", "batch_of"]


def row_tokens(row: RowTrace, tracer: LineTracer) -> np.ndarray:
    """The int32 tokens of a row (``seq_length + 1``)."""
    chunks = []
    for part in row.parts:
        if part.is_doc:
            chunks.append(tracer.read(part.dataset, part.file, part.doc, part.start, part.length))
        else:
            chunks.append(np.full(part.length, part.token, dtype=np.int64))
    return np.concatenate(chunks).astype(np.int32) if chunks else np.zeros(0, dtype=np.int32)


def batch_of(
    rows: Sequence[RowTrace], tracer: LineTracer, ignore_first: int = 0, dtype: str = "int64"
) -> dict[str, np.ndarray]:
    """One rank's ``input_ids`` and ``labels`` from its rows (in row order)."""
    lines = np.stack([row_tokens(row, tracer) for row in rows]).astype(np.int64)
    seq = lines.shape[1] - 1
    inputs = lines[:, :seq]
    labels = lines[:, 1:].copy()
    for i, row in enumerate(rows):
        keep = min(max(row.content - 1, 0), seq)
        labels[i, : min(ignore_first, keep)] = IGNORE_INDEX
        labels[i, keep:] = IGNORE_INDEX
    return {"input_ids": inputs.astype(dtype), "labels": labels.astype(dtype)}
