"""Fill-in-the-middle on packed lines, as fms-fsdp's ``mamba-fim`` branch does it.

Each document piece of a line whose content (the piece without a leading BOL/BOS and a
trailing EOS/EOL) holds at least ``min_length`` tokens is cut at two points drawn
uniformly into ``prefix``, ``middle`` and ``suffix`` and becomes, with probability
``psm_rate``, PSM::

    <PRE> prefix <SUF> suffix <MID> middle

or, with probability ``spm_rate``, SPM::

    <PRE> <SUF> suffix <MID> prefix middle

and otherwise stays as it is. A sentinel id of None inserts no token. The sentinels make
the line longer: what no longer fits is dropped from the line's end (counted in the
state's ``counts`` as ``overflow``, beside the ``psm`` and ``spm`` pieces written;
``fmsdata state show`` prints them).

fms-fsdp seeds this randomness by rank, so its lines change with the world size. Here a
line's draws come from a generator keyed by (seed, logical shard, index of the line in
its shard), so a line is the same on every world size and worker count, and the state
(lines seen, counts) is exact per line.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fmsdata.errors import StateMismatchError
from fmsdata.stages.base import Stage, TokenStage
from fmsdata.stages.outputs import TokenLine
from fmsdata.stages.traced import Part, TracedLine, cut_parts, parts_length

__all__ = ["FillInMiddle"]


class FillInMiddle(TokenStage):
    """Rewrites document pieces of each line as PSM / SPM fill-in-the-middle examples.

    Args:
        source: The chain it follows.
        key: The shard's random key for this stage (``Shard.key("fim")``).
        psm_rate: Probability of the PSM layout (with ``spm_rate``, at most 1).
        spm_rate: Probability of the SPM layout.
        pre: The ``<PRE>`` sentinel token id (None: no token inserted).
        mid: The ``<MID>`` sentinel token id (None: no token inserted).
        suf: The ``<SUF>`` sentinel token id (None: no token inserted).
        min_length: Pieces whose content is shorter stay as they are.
        frame: Line and document delimiters (BOL, BOS, EOS, EOL ids) that stay at the
            edges of a piece rather than being moved.
    """

    def __init__(
        self,
        source: Stage,
        key: int,
        psm_rate: float,
        spm_rate: float,
        pre: int | None,
        mid: int | None,
        suf: int | None,
        min_length: int = 2,
        frame: tuple[int, ...] = (),
    ):
        super().__init__(source)
        self.key = int(key)
        self.psm_rate = float(psm_rate)
        self.spm_rate = float(spm_rate)
        self.pre, self.mid, self.suf = pre, mid, suf
        self.min_length = int(min_length)
        self.frame = tuple(sorted({int(t) for t in frame}))
        self.lines = 0  # lines seen: the next line's draws are keyed by it
        self.psm = 0  # pieces written as PSM so far
        self.spm = 0
        self.overflow = 0  # tokens dropped from line ends

    @property
    def name(self) -> str:
        return "fim"

    def settings(self) -> dict[str, Any]:
        return {
            "psm_rate": self.psm_rate,
            "spm_rate": self.spm_rate,
            "fim_pre": self.pre,
            "fim_mid": self.mid,
            "fim_suf": self.suf,
            "min_length": self.min_length,
            "frame": list(self.frame),
        }

    def own_state(self) -> dict[str, Any]:
        counts = {"psm": self.psm, "spm": self.spm, "overflow": self.overflow}
        return {"lines": self.lines, "counts": counts}

    def load_own_state(self, state: dict[str, Any]) -> None:
        counts = state["counts"]
        if not isinstance(counts, dict) or set(counts) != {"psm", "spm", "overflow"}:
            raise StateMismatchError(f"{self.name}: counts must have psm, spm and overflow")
        self.lines = int(state["lines"])
        self.psm, self.spm = int(counts["psm"]), int(counts["spm"])
        self.overflow = int(counts["overflow"])

    @classmethod
    def report(cls, own: dict[str, Any]) -> dict[str, Any]:
        """Lines seen and the pieces rewritten as PSM and SPM, and those that overflowed."""
        return {"counts": {"lines": int(own["lines"]), **own["counts"]}}

    def _sentinel(self, token: int | None) -> list[np.ndarray]:
        return [] if token is None else [np.array([token], dtype=np.int32)]

    def _edges(self, piece: np.ndarray) -> tuple[int, int]:
        """Leading and trailing delimiter tokens of a piece (at most two each)."""
        return self._edge_counts(piece[:2], piece[-2:], len(piece))

    def _edge_counts(self, head: np.ndarray, tail: np.ndarray, size: int) -> tuple[int, int]:
        """``_edges`` of a piece of ``size`` tokens from its first and last ``min(2, size)``
        tokens, all it looks at (what ``trace`` reads)."""
        frame = self.frame
        lead = 0
        while lead < min(2, size) and int(head[lead]) in frame:
            lead += 1
        trail = 0
        while trail < min(2, size - lead) and int(tail[len(tail) - 1 - trail]) in frame:
            trail += 1
        return lead, trail

    def _layout(self, mode: float) -> str | None:
        if mode < self.psm_rate:
            return "psm"
        return "spm" if mode < self.psm_rate + self.spm_rate else None

    def apply(self, tokens: np.ndarray, content: int, line: TokenLine) -> int:
        rng = np.random.Generator(np.random.PCG64([self.key, self.lines]))
        self.lines += 1
        n = len(line.pieces)
        if n == 0 or self.psm_rate + self.spm_rate == 0.0:
            return content
        mode = rng.random(n)
        cuts = rng.random((n, 2))
        out: list[np.ndarray] = []
        lengths = line.pieces.copy()
        changed = False
        at = 0
        for k, size in enumerate(line.pieces.tolist()):
            piece = tokens[at : at + size]
            at += size
            layout = self._layout(float(mode[k]))
            lead, trail = self._edges(piece) if layout else (0, 0)
            body = piece[lead : size - trail]
            if layout is None or len(body) < max(self.min_length, 1):
                out.append(piece.copy())
                continue
            i, j = sorted(int(c) for c in np.floor(cuts[k] * (len(body) + 1)))
            prefix, middle, suffix = body[:i], body[i:j], body[j:]
            pre, mid, suf = (self._sentinel(t) for t in (self.pre, self.mid, self.suf))
            if layout == "psm":
                parts = [*pre, prefix, *suf, suffix, *mid, middle]
                self.psm += 1
            else:
                parts = [*pre, *suf, suffix, *mid, prefix, middle]
                self.spm += 1
            new = np.concatenate([piece[:lead], *parts, piece[size - trail :]])
            out.append(new)
            lengths[k] = len(new)
            changed = True
        if not changed:
            return content
        flat = np.concatenate(out)
        room = len(tokens)
        if len(flat) > room:
            self.overflow += len(flat) - room
            flat = flat[:room]
            ends = np.cumsum(lengths)
            keep = int(np.searchsorted(ends, room, side="left")) + 1
            lengths = lengths[:keep]
            line.ids = line.ids[:keep]
            lengths[-1] -= int(ends[keep - 1]) - room
        tokens[: len(flat)] = flat
        line.pieces = lengths
        return len(flat)

    def trace(self, line: TracedLine) -> None:
        """What ``apply`` does to the line, on its parts: the same draws (keyed by the
        line's index in its shard), the same cuts. The delimiters kept at a piece's edges
        are found as ``apply`` finds them, by token value: of a rearranged piece, the
        first and last two tokens are read where they are document tokens."""
        n = len(line.pieces)
        if n == 0 or self.psm_rate + self.spm_rate == 0.0:
            return
        rng = np.random.Generator(np.random.PCG64([self.key, self.lines + line.ahead]))
        mode = rng.random(n)
        cuts = rng.random((n, 2))
        out: list[list[Part]] = []
        changed = False
        for k, parts in enumerate(line.pieces):
            size = parts_length(parts)
            layout = self._layout(float(mode[k]))
            lead, trail = self._edge_counts(*line.edges(k), size) if layout else (0, 0)
            body = size - lead - trail
            if layout is None or body < max(self.min_length, 1):
                out.append(list(parts))
                continue
            i, j = sorted(int(c) for c in np.floor(cuts[k] * (body + 1)))
            prefix = _as(cut_parts(parts, lead, lead + i), "prefix")
            middle = _as(cut_parts(parts, lead + i, lead + j), "middle")
            suffix = _as(cut_parts(parts, lead + j, size - trail), "suffix")
            pre, mid, suf = (
                [] if t is None else [Part(kind, 1, token=t)]
                for kind, t in (("fim_pre", self.pre), ("fim_mid", self.mid), ("fim_suf", self.suf))
            )
            if layout == "psm":
                body_parts = [*pre, *prefix, *suf, *suffix, *mid, *middle]
            else:
                body_parts = [*pre, *suf, *suffix, *mid, *prefix, *middle]
            out.append(
                [*cut_parts(parts, 0, lead), *body_parts, *cut_parts(parts, size - trail, size)]
            )
            changed = True
        if not changed:
            return
        ids = list(line.ids)
        room = line.length
        lengths = np.array([parts_length(parts) for parts in out], dtype=np.int64)
        if int(lengths.sum()) > room:  # the end falls off, as in ``apply``
            ends = np.cumsum(lengths)
            keep = int(np.searchsorted(ends, room, side="left")) + 1
            out, ids = out[:keep], ids[:keep]
            last = int(lengths[keep - 1]) - (int(ends[keep - 1]) - room)
            out[-1] = cut_parts(out[-1], 0, last)
        line.set_content(out, ids)


def _as(parts: list[Part], role: str) -> list[Part]:
    """Document parts marked with what FIM made of them."""
    return [dataclasses.replace(p, role=role) if p.is_doc else p for p in parts]
