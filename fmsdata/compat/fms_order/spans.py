"""Lines and chunks as spans of the memory-mapped documents, not as token copies.

fms-fsdp holds its 10,000 buffered lines and its packing carry as tokens (163 MB of
state at 10,000 lines of 4,096). Every token of them is either a slice of a stripped
document or a delimiter the loader put there, so here a chunk or line is a list of
segments ``(source, doc, start, n, first)``:

- ``source >= 0``: tokens ``start .. start+n-1`` of document ``doc`` (stripped) of file
  ``source`` in the chain's file table;
- ``LIT``: one literal token (BOS, EOS, BOL, EOL), its value in ``first``;
- ``POOL``: tokens ``start .. start+n-1`` of the pool, the tokens of lines taken over from
  an fms-fsdp checkpoint (which holds no spans); they leave with those lines. The pool is
  int32, as fms-fsdp's batches are (10,000 lines of 4,097 tokens: 164 MB, not 328 MB
  as int64); a token outside int32 is a ``StateMismatchError``.

``first`` is the value of a segment's first token: the packer compares edges without
reading the file, and a saved state is checked against the data with it on load. Lines are
materialised (one slice copy per segment, straight into int32) only when output.

State (``encode``/``decode``): ``files`` (the relative paths and document counts of the
files named), ``counts`` (segments per line), ``segments`` (one column per field, each in
the narrowest integer type) and ``pool``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fmsdata.errors import StateMismatchError

from .arrowdocs import ArrowDocs

__all__ = ["LIT", "POOL", "Segment", "Tokens"]

LIT = -1
POOL = -2

Segment = tuple[int, int, int, int, int]


def _narrow(values: np.ndarray) -> np.ndarray:
    """``values`` in the smallest signed integer type that holds them (smaller states)."""
    lo, hi = (int(values.min()), int(values.max())) if values.size else (0, 0)
    types = (np.int8, np.int16, np.int32)
    fits = (t for t in types if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max)
    return values.astype(next(fits, np.int64))


def _check_int32(values: np.ndarray, where: str) -> None:
    """Token values must fit int32 (fms-fsdp's ``torch.IntTensor`` lines)."""
    if values.dtype.kind not in "iu":
        raise StateMismatchError(f"{where}: tokens of type {values.dtype}, expected integers")
    info = np.iinfo(np.int32)
    lo, hi = int(values.min()), int(values.max())
    if lo < info.min or hi > info.max:
        raise StateMismatchError(f"{where}: token values {lo}..{hi} do not fit int32")


class Tokens:
    """Where a chain's tokens come from: its files (by id) and the pool.

    Args:
        docs: The chain's document reader (its ``paths`` are the file table).
        names: Each file's path relative to the data folder, as saved in states.
    """

    def __init__(self, docs: ArrowDocs, names: list[str]):
        self.docs, self.names = docs, names  # the chain fills ``names`` as it lists files
        self.pool = np.zeros(0, np.int32)

    # -- values and edits --------------------------------------------------------------
    def value(self, seg: Segment, pos: int) -> int:
        """The token at offset ``pos`` of ``seg``."""
        source, doc, start = seg[0], seg[1], seg[2]
        if pos == 0:
            return seg[4]
        if source == POOL:
            return int(self.pool[start + pos])
        return int(self.docs.get(source, doc)[start + pos])

    def last(self, segs: list[Segment]) -> int:
        seg = segs[-1]
        return self.value(seg, seg[3] - 1)

    def split(self, segs: list[Segment], k: int) -> tuple[list[Segment], list[Segment]]:
        """The first ``k`` tokens of ``segs`` and the rest."""
        for i, seg in enumerate(segs):
            n = seg[3]
            if k < n:
                if k == 0:
                    return segs[:i], segs[i:]
                source, doc, start, _, first = seg
                left = (source, doc, start, k, first)
                right = (source, doc, start + k, n - k, self.value(seg, k))
                return [*segs[:i], left], [right, *segs[i + 1 :]]
            k -= n
        return list(segs), []

    def pop_last(self, segs: list[Segment]) -> Segment:
        """Remove the last token of ``segs`` (in place) and return it as a segment."""
        seg = segs[-1]
        source, doc, start, n, first = seg
        if n == 1:
            segs.pop()
            return seg
        segs[-1] = (source, doc, start, n - 1, first)
        return (source, doc, start + n - 1, 1, self.value(seg, n - 1))

    def materialize(self, segs: list[Segment], length: int) -> np.ndarray:
        """The tokens of ``segs`` (``length`` of them) as one int32 array."""
        out = np.empty(length, np.int32)
        pos = 0
        get = self.docs.get
        for source, doc, start, n, first in segs:
            if source >= 0:
                out[pos : pos + n] = get(source, doc)[start : start + n]
            elif source == LIT:
                out[pos] = first
            else:
                out[pos : pos + n] = self.pool[start : start + n]
            pos += n
        assert pos == length, (pos, length)
        return out

    # -- fms-fsdp's token lines ---------------------------------------------------------
    def adopt(self, lines: list[Any], where: str = "buffer") -> list[list[Segment]]:
        """Lines of tokens (an fms-fsdp checkpoint's: lists of ints, or arrays) as pool
        segments, appended to the pool. Each line is copied straight into the int32 pool,
        so no int64 copy of all of them exists at once."""
        sizes = [line.size if isinstance(line, np.ndarray) else len(line) for line in lines]
        offset = len(self.pool)
        pool = np.empty(offset + sum(sizes), np.int32)
        pool[:offset] = self.pool
        out = []
        for i, (line, n) in enumerate(zip(lines, sizes)):
            if n:
                array = np.asarray(line).reshape(-1)
                _check_int32(array, f"{where}[{i}]")
                pool[offset : offset + n] = array
            out.append([(POOL, 0, offset, n, int(pool[offset]))] if n else [])
            offset += n
        self.pool = pool
        return out

    # -- state ------------------------------------------------------------------------
    def lines(self, saved: Any, where: str) -> list[list[Segment]]:
        """Buffered lines from a state: fmsdata's encoded spans (a dict, checked), or
        fms-fsdp's lines of tokens (a list), taken over as pool segments."""
        if isinstance(saved, dict):
            return self.decode(saved, where)
        return self.adopt(saved, where)

    def encode(self, lines: list[list[Segment]]) -> dict[str, Any]:
        """``lines`` as plain arrays: the files they name and their segments."""
        flat = [seg for line in lines for seg in line]
        table = np.array(flat, np.int64).reshape(-1, 5)
        sources = table[:, 0].copy()
        named = np.unique(sources[sources >= 0])
        remap = np.full(len(self.names) + 1, -1, np.int64)
        remap[named] = np.arange(len(named))
        files = sources >= 0
        sources[files] = remap[sources[files]]
        starts = table[:, 2].copy()
        pooled = np.flatnonzero(table[:, 0] == POOL)
        pool = np.zeros(0, np.int64)
        if len(pooled):
            runs = [self.pool[s : s + n] for s, n in zip(table[pooled, 2], table[pooled, 3])]
            lens = np.array([len(r) for r in runs])
            starts[pooled] = np.concatenate([[0], np.cumsum(lens)[:-1]])
            pool = np.concatenate(runs)
        return {
            "files": [[self.names[i], self.docs.count(int(i))] for i in named],
            "counts": _narrow(np.array([len(line) for line in lines], np.int64)),
            "segments": {
                "source": _narrow(sources),
                "doc": _narrow(table[:, 1]),
                "start": _narrow(starts),
                "n": _narrow(table[:, 3]),
                "first": _narrow(table[:, 4]),
            },
            "pool": _narrow(pool),
        }

    def decode(self, state: dict[str, Any], where: str) -> list[list[Segment]]:
        """The lines of ``encode``'s output, each span checked against the data.

        Raises:
            StateMismatchError: A file that is gone or holds another number of documents,
                or a span that does not fit its document or starts with another token;
                the message names ``where`` (the state's path and key) and the values.
        """
        known = {name: i for i, name in enumerate(self.names)}
        ids = []
        for name, n_docs in state["files"]:
            fid = known.get(name)
            if fid is None:
                raise StateMismatchError(
                    f"{where}: buffered lines name file {name!r}, which this config's "
                    "datasets do not hold"
                )
            have = self.docs.count(fid)
            if have != n_docs:
                raise StateMismatchError(
                    f"{where}: file {name!r} held {n_docs} documents when saved, now {have}"
                )
            ids.append(fid)
        seg = state["segments"]
        cols = [np.asarray(seg[k], np.int64) for k in ("source", "doc", "start", "n", "first")]
        table = np.stack(cols, axis=1) if cols[0].size else np.zeros((0, 5), np.int64)
        pool = np.asarray(state["pool"])
        if len(pool):
            _check_int32(pool, f"{where}.pool")
        pool = pool.astype(np.int32, copy=False)
        offset = len(self.pool)
        if len(pool):
            self.pool = np.concatenate([self.pool, pool])
        rows: list[Segment] = []
        for source, doc, start, n, first in table.tolist():
            if n < 1:
                raise StateMismatchError(f"{where}: a segment of {n} tokens")
            if source >= 0:
                if source >= len(ids):
                    raise StateMismatchError(f"{where}: segment names file #{source} of {len(ids)}")
                fid = ids[source]
                name = self.names[fid]
                if not 0 <= doc < state["files"][source][1]:
                    raise StateMismatchError(f"{where}: {name!r} has no document {doc}")
                tokens = self.docs.get(fid, doc)
                if start < 0 or start + n > len(tokens) or int(tokens[start]) != first:
                    got = int(tokens[start]) if 0 <= start < len(tokens) else None
                    raise StateMismatchError(
                        f"{where}: {name!r} document {doc} does not hold the saved span "
                        f"(tokens {start}..{start + n - 1} of {len(tokens)}, first token "
                        f"saved {first}, found {got}): the data changed since the save"
                    )
                rows.append((fid, doc, start, n, first))
            elif source == POOL:
                if start < 0 or start + n > len(pool) or int(pool[start]) != first:
                    raise StateMismatchError(f"{where}: pool run {start}+{n} out of its pool")
                rows.append((POOL, 0, offset + start, n, first))
            elif source == LIT:
                rows.append((LIT, 0, 0, 1, first))
            else:
                raise StateMismatchError(f"{where}: segment source {source} is not valid")
        counts = np.asarray(state["counts"], np.int64)
        if int(counts.sum()) != len(rows):
            raise StateMismatchError(
                f"{where}: counts add up to {int(counts.sum())} segments, {len(rows)} saved"
            )
        bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
        return [rows[bounds[i] : bounds[i + 1]] for i in range(len(counts))]
