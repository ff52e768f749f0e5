"""Per-document transforms and filters on tokens, with exact accounting of what they drop.

``DocumentTransform`` calls ``fn(tokens, document_id)`` on each document piece of a line
(the piece's tokens, BOS/EOS and the line's BOL/EOL included, and the id of its source
document, see ``fmsdata.stages.outputs``) and puts back what it returns: the same tokens,
others (shorter or longer), or None to drop the piece. ``DocumentFilter`` keeps the
pieces for which ``keep(tokens, document_id)`` is true. The pieces that remain close up;
the line's end is padding (``pad``, labels ignored), and tokens that no longer fit are
dropped from the end.

A document split over lines is judged piece by piece: each line sees only its own piece.
Pack with ``packing: pad`` to judge whole documents (a document then sits in one line
unless it is longer than a line).

Coverage: the documents are still *read* exactly once per epoch (the span-level chain is
unchanged, so G4 holds for what is read); what is *delivered* is what was read minus what
this stage dropped, and its state counts that exactly (``pieces``, ``dropped_pieces``,
``dropped_tokens``: tokens of dropped pieces, ``trimmed_tokens``: tokens a transform took
out of kept pieces or that fell off a line's end, ``added_tokens``: tokens a transform
added), kept under ``counts`` in its own state: ``fmsdata state show`` prints the
``counts`` of every stage that keeps them, summed over the logical shards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.stages.base import Stage, TokenStage
from fmsdata.stages.outputs import TokenLine

__all__ = ["DocumentTransform", "DocumentFilter", "COUNTS"]

COUNTS = ("lines", "pieces", "dropped_pieces", "dropped_tokens", "trimmed_tokens", "added_tokens")


class DocumentTransform(TokenStage):
    """Applies ``fn(tokens, document_id) -> tokens | None`` to every document piece.

    Args:
        source: The chain it follows.
        fn: A module-level function (workers receive it pickled); None drops the piece.
        pad: Token written after the line's content when it got shorter.
        label: Names the transform in the state fingerprint: a state saved with another
            label is refused (default: the function's qualified name).
    """

    def __init__(
        self,
        source: Stage,
        fn: Callable[[np.ndarray, int], Any],
        pad: int = 0,
        label: str | None = None,
    ):
        super().__init__(source)
        if not callable(fn):
            raise ConfigError(f"{type(self).__name__} needs a function, got {fn!r}")
        self.fn = fn
        self.pad = int(pad)
        self.label = label or f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
        self.counts = dict.fromkeys(COUNTS, 0)

    def settings(self) -> dict[str, Any]:
        return {"fn": self.label, "pad": self.pad}

    def own_state(self) -> dict[str, Any]:
        return {"counts": dict(self.counts)}

    def load_own_state(self, state: dict[str, Any]) -> None:
        counts = state["counts"]
        if not isinstance(counts, dict) or set(counts) != set(COUNTS):
            raise StateMismatchError(f"{self.name}: counts must have the keys {COUNTS}")
        self.counts = {k: int(counts[k]) for k in COUNTS}

    def report(self, own: dict[str, Any]) -> dict[str, Any]:
        """Its ``counts`` (lines, pieces seen, pieces and tokens dropped, trimmed, added)."""
        return {"counts": {k: int(v) for k, v in own["counts"].items()}}

    def _piece(self, piece: np.ndarray, document_id: int) -> np.ndarray | None:
        out = self.fn(piece, document_id)
        if out is None:
            return None
        out = np.asarray(out)
        if out.ndim != 1 or (out.size and out.dtype.kind not in "iu"):
            raise ConfigError(
                f"{self.label} must return a 1-d array of token ids or None, got "
                f"{out.dtype} of shape {out.shape}"
            )
        return out.astype(np.int32)

    def apply(self, tokens: np.ndarray, content: int, line: TokenLine) -> int:
        c = self.counts
        c["lines"] += 1
        out: list[np.ndarray] = []
        lengths: list[int] = []
        ids: list[int] = []
        at = 0
        for size, doc in zip(line.pieces.tolist(), line.ids.tolist()):
            piece = tokens[at : at + size].copy()
            at += size
            c["pieces"] += 1
            new = self._piece(piece, doc)
            if new is None:
                c["dropped_pieces"] += 1
                c["dropped_tokens"] += size
                continue
            c["trimmed_tokens"] += max(size - len(new), 0)
            c["added_tokens"] += max(len(new) - size, 0)
            if len(new):
                out.append(new)
                lengths.append(len(new))
                ids.append(doc)
        flat = np.concatenate(out) if out else np.zeros(0, dtype=np.int32)
        pieces = np.asarray(lengths, dtype=np.int64)
        room = len(tokens)
        if len(flat) > room:
            c["trimmed_tokens"] += len(flat) - room
            flat = flat[:room]
            ends = np.cumsum(pieces)
            keep = int(np.searchsorted(ends, room, side="left")) + 1
            pieces, ids = pieces[:keep], ids[:keep]
            pieces[-1] -= int(ends[keep - 1]) - room
        tokens[: len(flat)] = flat
        tokens[len(flat) :] = self.pad
        line.pieces = pieces
        line.ids = np.asarray(ids, dtype=np.int64)
        return len(flat)


class DocumentFilter(DocumentTransform):
    """Keeps the document pieces for which ``keep(tokens, document_id)`` is true; drops
    and counts the others (see the module docstring)."""

    def __init__(
        self,
        source: Stage,
        keep: Callable[[np.ndarray, int], bool],
        pad: int = 0,
        label: str | None = None,
    ):
        label = label or f"{getattr(keep, '__module__', '?')}.{getattr(keep, '__qualname__', keep)}"
        super().__init__(source, keep, pad, label)

    def _piece(self, piece: np.ndarray, document_id: int) -> np.ndarray | None:
        return piece if self.fn(piece, document_id) else None
