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

from typing import Any

import numpy as np

from fmsdata.errors import StateMismatchError
from fmsdata.stages.base import Stage, TokenStage
from fmsdata.stages.outputs import TokenLine

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
        frame = self.frame
        lead = 0
        while lead < min(2, len(piece)) and int(piece[lead]) in frame:
            lead += 1
        trail = 0
        while trail < min(2, len(piece) - lead) and int(piece[len(piece) - 1 - trail]) in frame:
            trail += 1
        return lead, trail

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
            layout = "psm" if mode[k] < self.psm_rate else None
            if layout is None and mode[k] < self.psm_rate + self.spm_rate:
                layout = "spm"
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
