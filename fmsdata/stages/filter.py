"""Per-document transforms and filters on tokens, with exact accounting of what they drop.

``DocumentTransform`` calls ``fn(tokens, document_id)`` on each document piece of a line
(the piece's tokens, BOS/EOS and the line's BOL/EOL included, and the id of its source
document, see ``fmsdata.stages.outputs``) and puts back what it returns: the same tokens,
others (shorter or longer), or None to drop the piece. ``DocumentFilter`` keeps the
pieces for which ``keep(tokens, document_id)`` is true. The pieces that remain close up;
the line's end is padding (``pad``, labels ignored), and tokens that no longer fit are
dropped from the end.

A document split over lines is judged piece by piece: each line sees only its own piece.
Pack with ``packing: best_fit`` (or ``pad``) to judge whole documents (a document then sits
in one line unless it is longer than a line).

Coverage: the documents are still *read* exactly once per epoch (the span-level chain is
unchanged, so G4 holds for what is read); what is *delivered* is what was read minus what
this stage dropped, and its state counts that exactly (``pieces``, ``dropped_pieces``,
``dropped_tokens``: tokens of dropped pieces, ``trimmed_tokens``: tokens a transform took
out of kept pieces or that fell off a line's end, ``added_tokens``: tokens a transform
added), kept under ``counts`` in its own state: ``fmsdata state show`` prints the
``counts`` of every stage that keeps them, summed over the logical shards.

Per dataset (by the dataset index of the spans) it keeps, under ``datasets``, the
document tokens it took out (``dropped``: tokens of dropped pieces, without the line's
BOL/EOL; ``trimmed``; ``added``) and the documents it damaged (``docs``: documents with a
dropped piece all of whose pieces it has seen), and, under ``open``, the pieces it saw of
documents split over lines whose other pieces it has not seen yet (``OPEN_COLUMNS``). A
piece ends its document when another piece follows it in the line, or when it reaches the
document's known length. ``report`` gives ``fmsdata state show`` the tokens taken out and
the damaged documents per dataset, and the split documents damaged so far: those no stage
still holds a piece of count as dropped, the others as held (``fmsdata.state.report``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.stages.base import DatasetRenumbering, Stage, TokenStage
from fmsdata.stages.outputs import TokenLine, document_ids_of
from fmsdata.stages.spans import DLEN, DOC, DS, FILE, LENGTH, START
from fmsdata.stages.traced import Part, TracedLine

__all__ = ["DocumentTransform", "DocumentFilter", "COUNTS", "DATASET_COLUMNS", "OPEN_COLUMNS"]

COUNTS = ("lines", "pieces", "dropped_pieces", "dropped_tokens", "trimmed_tokens", "added_tokens")
# Per dataset index: document tokens dropped, trimmed and added; damaged documents.
DATASET_COLUMNS = ("dropped", "trimmed", "added", "docs")
# A piece of a split document: which document, where in it, dropped or not, ends it or not.
OPEN_COLUMNS = ("dataset", "file", "doc", "start", "length", "dropped", "ends")


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
        self.per_dataset = np.zeros((0, len(DATASET_COLUMNS)), dtype=np.int64)
        # (dataset, file, doc) -> [[start, length, dropped, ends], ...]
        self.open: dict[tuple[int, int, int], list[list[int]]] = {}

    def settings(self) -> dict[str, Any]:
        return {"fn": self.label, "pad": self.pad}

    def own_state(self) -> dict[str, Any]:
        rows = [[*key, *piece] for key, pieces in self.open.items() for piece in pieces]
        return {
            "counts": dict(self.counts),
            "datasets": self.per_dataset.copy(),
            "open": np.asarray(rows, dtype=np.int64).reshape(-1, len(OPEN_COLUMNS)),
        }

    def load_own_state(self, state: dict[str, Any]) -> None:
        counts = state["counts"]
        if not isinstance(counts, dict) or set(counts) != set(COUNTS):
            raise StateMismatchError(f"{self.name}: counts must have the keys {COUNTS}")
        self.counts = {k: int(counts[k]) for k in COUNTS}
        self.per_dataset = _table(state["datasets"], DATASET_COLUMNS, f"{self.name}: datasets")
        rows = _table(state["open"], OPEN_COLUMNS, f"{self.name}: open")
        self.open = {}
        for row in rows.tolist():
            self.open.setdefault((row[0], row[1], row[2]), []).append(row[3:])

    @classmethod
    def carry_over(
        cls, own: dict[str, Any], inputs: dict[str, Any], change: DatasetRenumbering
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The per-dataset rows and open pieces in the new dataset numbering (a dataset no
        longer listed loses its rows)."""
        per_dataset = _table(own["datasets"], DATASET_COLUMNS, f"{cls.__name__}: datasets")
        number = np.asarray(change.number, dtype=np.int64)[: len(per_dataset)]
        moved = np.zeros(
            (max(len(change.mix), int(number.max(initial=-1)) + 1), len(DATASET_COLUMNS)), np.int64
        )
        moved[number[number >= 0]] = per_dataset[number >= 0]
        rows = _table(own["open"], OPEN_COLUMNS, f"{cls.__name__}: open").copy()
        rows[:, 0] = np.asarray(change.number, dtype=np.int64)[rows[:, 0]]
        return {**own, "datasets": moved, "open": rows[rows[:, 0] >= 0]}, inputs

    @classmethod
    def report(cls, own: dict[str, Any]) -> dict[str, Any]:
        """Its ``counts`` (lines, pieces seen, pieces and tokens dropped, trimmed, added),
        and per dataset index the document tokens it took out (``dropped_tokens``: dropped
        plus trimmed less added), the documents it damaged whose pieces it has all seen
        (``dropped_docs``), and the damaged documents whose other pieces it has not seen
        yet (``dropped_open``: rows of dataset, file, doc)."""
        per_dataset = _table(own["datasets"], DATASET_COLUMNS, "datasets")
        dropped, trimmed, added, docs = per_dataset.T
        rows = _table(own["open"], OPEN_COLUMNS, "open")
        damaged = {tuple(row[:3]) for row in rows.tolist() if row[5]}
        return {
            "counts": {k: int(v) for k, v in own["counts"].items()},
            "dropped_tokens": (dropped + trimmed - added).tolist(),
            "dropped_docs": docs.tolist(),
            "dropped_open": sorted(damaged),
        }

    def _count(self, ds: int, column: int, n: int) -> None:
        if ds >= len(self.per_dataset):
            grown = np.zeros((ds + 1, len(DATASET_COLUMNS)), dtype=np.int64)
            grown[: len(self.per_dataset)] = self.per_dataset
            self.per_dataset = grown
        self.per_dataset[ds, column] += n

    def _seen(self, span: np.ndarray, ends: bool, dropped: bool) -> None:
        """Count a piece of the document ``span`` names: a damaged document once all its
        pieces are seen (a split document's pieces wait in ``open`` until then)."""
        ds, start = int(span[DS]), int(span[START])
        if start == 0 and ends:
            self._count(ds, 3, int(dropped))
            return
        key = (ds, int(span[FILE]), int(span[DOC]))
        pieces = self.open.setdefault(key, [])
        pieces.append([start, int(span[LENGTH]), int(dropped), int(ends)])
        pieces.sort()
        at = 0
        for piece_start, length, _, _ in pieces:
            if piece_start != at:
                return
            at += length
        if pieces[-1][3]:
            del self.open[key]
            self._count(ds, 3, int(any(piece[2] for piece in pieces)))

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
        spans = line.spans
        # Which span each piece is (a line holds one piece per document), and whether the
        # pieces are still the spans' own (no stage before moved tokens): then a piece's
        # document tokens are its span's length, without the line's BOL/EOL.
        span_ids = document_ids_of(spans).tolist()
        row_of = {doc: i for i, doc in enumerate(span_ids)}
        own = span_ids == line.ids.tolist()
        at = 0
        for size, doc in zip(line.pieces.tolist(), line.ids.tolist()):
            piece = tokens[at : at + size].copy()
            at += size
            c["pieces"] += 1
            new = self._piece(piece, doc)
            i = row_of.get(doc, -1)
            ds = int(spans[i, DS]) if i >= 0 else -1
            if i >= 0:
                span = spans[i]
                ends = i < len(spans) - 1 or 0 <= span[DLEN] == span[START] + span[LENGTH]
                self._seen(span, bool(ends), new is None)
            if new is None:
                c["dropped_pieces"] += 1
                c["dropped_tokens"] += size
                if ds >= 0:
                    self._count(ds, 0, int(spans[i, LENGTH]) if own else size)
                continue
            c["trimmed_tokens"] += max(size - len(new), 0)
            c["added_tokens"] += max(len(new) - size, 0)
            if ds >= 0:
                self._count(ds, 1, max(size - len(new), 0))
                self._count(ds, 2, max(len(new) - size, 0))
            if len(new):
                out.append(new)
                lengths.append(len(new))
                ids.append(doc)
        flat = np.concatenate(out) if out else np.zeros(0, dtype=np.int32)
        pieces = np.asarray(lengths, dtype=np.int64)
        room = len(tokens)
        if len(flat) > room:
            c["trimmed_tokens"] += len(flat) - room
            cut = np.cumsum(lengths) - room
            for doc, n in zip(ids, np.clip(cut, 0, lengths).tolist()):
                if n and doc in row_of:
                    self._count(int(spans[row_of[doc], DS]), 1, n)
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


def _table(value: Any, columns: tuple[str, ...], where: str) -> np.ndarray:
    """A saved ``[n, len(columns)]`` integer table, checked."""
    table = np.asarray(value)
    if table.size == 0:
        return np.zeros((0, len(columns)), dtype=np.int64)
    if table.ndim != 2 or table.shape[1] != len(columns) or table.dtype.kind not in "iu":
        raise StateMismatchError(
            f"{where} must be an integer table with the columns {columns}, got "
            f"{table.dtype} of shape {table.shape}"
        )
    return table.astype(np.int64)


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

    def trace(self, line: TracedLine) -> None:
        """What ``apply`` does to the line, on its parts: each piece is judged by
        ``keep`` on its tokens (read: the decision is the function's, on token values),
        dropped pieces close up and the row ends in ``pad``. A kept piece is unchanged, so
        nothing overflows."""
        kept: list[list[Part]] = []
        ids: list[int] = []
        for parts, document_id in zip(line.pieces, line.ids):
            if self._piece(line.tokens(parts), document_id) is None:
                line.drop(parts, document_id, self.name)
            else:
                kept.append(parts)
                ids.append(document_id)
        line.set_content(kept, ids, pad=self.pad)
