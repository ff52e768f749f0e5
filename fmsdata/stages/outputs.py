"""From packed token rows to the tensors a training step takes.

The causal-LM shift (``input_ids = line[:-1]``, ``labels = line[1:]`` with ``-100`` where
the target is padding) and the optional document structure of each line
(``position_ids`` restarting at each document, segment lengths for ``cu_seqlens``).
Everything works on a whole block of rows at once.
"""

from __future__ import annotations

import numpy as np

from fmsdata.stages.base import LENGTH

__all__ = ["IGNORE_INDEX", "causal_lm", "segment_lengths", "position_ids"]

IGNORE_INDEX = -100


def causal_lm(tokens: np.ndarray, content: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shift rows of ``line_length`` tokens into inputs and targets.

    Args:
        tokens: [rows, line_length] int64.
        content: [rows] count of non-pad tokens per row.

    Returns:
        ``(input_ids, labels)``, each [rows, line_length - 1], contiguous; labels are
        ``IGNORE_INDEX`` where the target token is padding.
    """
    input_ids = np.ascontiguousarray(tokens[:, :-1])
    labels = np.ascontiguousarray(tokens[:, 1:])
    seq = labels.shape[1]
    padded = content <= seq
    if padded.any():
        target_pos = np.arange(1, seq + 1)[None, :]
        labels[(target_pos >= content[:, None]) & padded[:, None]] = IGNORE_INDEX
    return input_ids, labels


def segment_lengths(
    spans: np.ndarray, has_bol: bool, has_eol: bool, content: int, seq: int
) -> np.ndarray:
    """Lengths of the document pieces of one line's *inputs* (its first ``seq`` tokens).

    BOL joins the first piece and EOL the last; padding is one final segment. The lengths
    sum to ``seq``.
    """
    lengths = spans[:, LENGTH].copy()
    lengths[0] += has_bol
    lengths[-1] += has_eol
    if content < seq + 1:
        lengths = np.append(lengths, seq + 1 - content)
    lengths[-1] -= 1  # inputs drop the line's last token
    return lengths[lengths > 0]


def position_ids(segments: np.ndarray, seq: int) -> np.ndarray:
    """Positions restarting at 0 at each segment; ``segments`` sums to ``seq``."""
    starts = np.cumsum(segments) - segments
    return np.arange(seq, dtype=np.int64) - np.repeat(starts, segments)
