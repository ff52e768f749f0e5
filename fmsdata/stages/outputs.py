"""What a packed line becomes in a batch besides its tokens: the label ignored on padding
(``IGNORE_INDEX``) and the document pieces of a line's inputs (for ``position_ids`` and
``cu_seqlens``, built per batch in ``fmsdata.transport``).
"""

from __future__ import annotations

import numpy as np

from fmsdata.stages.base import LENGTH

__all__ = ["IGNORE_INDEX", "segment_lengths"]

IGNORE_INDEX = -100


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
