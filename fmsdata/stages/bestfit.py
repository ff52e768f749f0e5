"""Pack documents into lines best-fit-decreasing over a bounded window, without cutting any
document that fits a line (``packing: best_fit``).

``hard`` packing cuts every document that crosses a line's end, so the rest is trained on
without its beginning; ``pad`` packing (next-fit) closes a line as soon as the next
document does not fit and pads the rest. Best-fit-decreasing ("Fewer Truncations Improve
Language Modeling", Ding et al. 2024) places the documents of a window longest first, each
into the open line it fills best: on the long-document corpus of
``benchmarks/throughput.py`` (median 600, mean 1,500 tokens, seq 4,096) it pads 0.2 % of
the lines' tokens where next-fit pads 13 %, and cuts only documents longer than a line
(``benchmarks/packing.py``). The rule, the window and the bound on open lines are
``fmsdata.stages.bestfitplan``'s; this module runs it on a document source, hands the
lines out and keeps its state.

A window is *taken* from the source (committed) when its first line is handed out: from
then on its documents are in lines handed out, in lines the packer still holds (the
window's lines not handed out yet, *ready*), or in the lines it left *open* for the next
window. So the saved state holds exactly what was taken and not handed out, as spans —
``fmsdata state show`` subtracts them, a mix change renumbers them, a resume checks them
against the files — and a resume continues with the very next line, on any number of
ranks (each logical shard's packer is its own).
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any

import numpy as np

from fmsdata.errors import ConfigError
from fmsdata.stages.base import DatasetRenumbering, LineChange, SpanStage
from fmsdata.stages.bestfitplan import plan_best_fit
from fmsdata.stages.lineblock import LineBlock
from fmsdata.stages.savedlines import pack_lines, pack_rows, unpack_lines
from fmsdata.stages.source import Documents, DocumentSource
from fmsdata.stages.spans import (
    BASE,
    DLEN,
    DOC,
    DS,
    FILE,
    LENGTH,
    SAVED_SPAN_WIDTH,
    SPAN_WIDTH,
    START,
    restore_spans,
)
from fmsdata.util.statecheck import fail, need_count, need_keys, need_mapping, within

__all__ = ["BestFitPacker", "COUNTS"]

# What the packer counts over the lines it closed (handed out or ready), as ``state show``
# prints them: lines, their document room (lines x capacity), padding in it, document
# pieces in them, and documents longer than a line (cut into line-sized pieces).
COUNTS = ("lines", "line_tokens", "padding_tokens", "document_pieces", "cut_documents")


@dataclasses.dataclass
class _Plan:
    """Lines planned over whole windows of read-ahead documents, handed out in order.

    Window ``w``'s lines are ``lines`` ``window_lines[w] .. window_lines[w + 1] - 1``, and
    the lines it leaves open are ``open`` ``window_open[w] .. window_open[w + 1] - 1``;
    ``before`` is what was open before the first window. The first ``entered`` windows are
    taken from the source (their figures counted).
    """

    lines: LineBlock
    window_lines: list[int]
    open: LineBlock
    window_open: list[int]
    before: LineBlock
    stats: np.ndarray  # [windows, 4] per window: lines, padding, pieces, documents cut
    entered: int = 0
    next_line: int = 0

    @property
    def remaining(self) -> int:
        return len(self.lines) - self.next_line

    def window_of(self, line: int) -> int:
        return bisect.bisect_right(self.window_lines, line) - 1

    def left_open(self) -> LineBlock:
        """The lines open after the last window taken."""
        if not self.entered:
            return self.before
        w = self.entered - 1
        return self.open.slice(self.window_open[w], self.window_open[w + 1])

    def ready(self) -> LineBlock:
        """The lines of the last window taken not handed out yet."""
        if not self.entered:
            return LineBlock.empty()
        return self.lines.slice(self.next_line, self.window_lines[self.entered])


class BestFitPacker(SpanStage):
    """Yields lines of spans holding at most ``capacity`` tokens, packed best-fit-decreasing
    over windows of ``window`` documents (``fmsdata.stages.bestfitplan``); the writer pads
    the rest of each line.

    State keys: ``ready`` (lines of the last window taken, not handed out), ``open`` (the
    lines it left open), both in the saved form of ``fmsdata.stages.savedlines`` with every
    length written out; ``counts`` (``COUNTS``, over the lines closed so far); ``source``
    (the document source's state, taken up to the last window taken).

    Args:
        source: Any document source (``fmsdata.stages.source``): the mixer, one
            dataset's stream, or a user's own.
        capacity: Document tokens per line (line length minus BOL/EOL).
        window: Documents per window (config ``pack_window``).
    """

    role = "packer"

    def __init__(self, source: DocumentSource, capacity: int, window: int):
        if capacity < 1:
            raise ConfigError(f"a line needs room for at least one document token, got {capacity}")
        if window < 1:
            raise ConfigError(f"pack_window must be at least 1 document, got {window}")
        super().__init__(source)
        self.source: DocumentSource = source
        self.capacity = capacity
        self.window = window
        self.counts = dict.fromkeys(COUNTS, 0)
        self._plan = _restored(LineBlock.empty(), LineBlock.empty())
        self._uncommitted = 0  # documents of windows taken, not yet committed upstream
        self._pending = Documents.empty()  # read-ahead documents not in a planned window

    def __next__(self) -> np.ndarray:
        block = self._planned(1)
        return block.spans.copy()  # as ``take``: a line kept does not keep the plan

    def take(self, n: int) -> list[np.ndarray]:
        if self._changed_from(BestFitPacker, "__next__"):
            return super().take(n)  # a subclass that changed __next__ is taken at its word
        return self._planned(n).lines()

    def take_lines(self, n: int) -> LineBlock:
        """The next ``n`` lines: views of the plans' spans (a stage that keeps lines copies
        them: the shuffle buffer into its store)."""
        if self._changed_from(BestFitPacker, "__next__", "take"):
            return super().take_lines(n)  # a subclass is taken at its word
        return self._planned(n)

    def _planned(self, n: int) -> LineBlock:
        blocks: list[LineBlock] = []
        taken = 0
        while taken < n:
            plan = self._plan
            while not plan.remaining:
                plan = self._plan_more()
            j = plan.next_line
            k = min(n - taken, plan.remaining)
            blocks.append(plan.lines.slice(j, j + k))
            plan.next_line = j + k
            self._enter(plan, plan.window_of(j + k - 1) + 1)
            taken += k
        return LineBlock.concat(blocks)

    def _enter(self, plan: _Plan, windows: int) -> None:
        """Take the plan's windows up to ``windows`` from the source: their documents are
        committed (when state is asked for: nothing upstream needs it sooner), their lines'
        figures counted."""
        if windows <= plan.entered:
            return
        self._uncommitted += (windows - plan.entered) * self.window
        totals = plan.stats[plan.entered : windows].sum(axis=0)
        for key, total in zip(_STAT_COUNTS, totals):
            self.counts[key] += int(total)
        # Summed, not lines x capacity: lines closed before a change of line length on
        # resume keep their own room.
        self.counts["line_tokens"] += int(totals[_STAT_COUNTS.index("lines")]) * self.capacity
        plan.entered = windows

    def _plan_more(self) -> _Plan:
        old = self._plan
        self._enter(old, len(old.window_lines) - 1)  # windows left that emitted no line
        docs = self._pending
        while len(docs) < self.window:
            docs = docs.then(self.source.read_ahead())
        whole = len(docs) // self.window * self.window
        self._pending = docs.take(whole)
        opened = old.left_open()
        spans, offsets, window_lines, open_spans, open_offsets, window_open, stats = plan_best_fit(
            np.ascontiguousarray(opened.spans),
            np.ascontiguousarray(opened.offsets),
            _rows(docs.take(0, whole)),
            self.window,
            self.capacity,
        )
        self._plan = _Plan(
            LineBlock(spans, offsets),
            window_lines.tolist(),
            LineBlock(open_spans, open_offsets),
            window_open.tolist(),
            opened,
            stats,
        )
        return self._plan

    # -- stage protocol ------------------------------------------------------------------

    def own_state(self) -> dict[str, Any]:
        # Runs before the source's state is taken (``Stage.state_dict``): the windows taken
        # are committed to it first.
        if self._uncommitted:
            self.source.commit(self._uncommitted)
            self._uncommitted = 0
        return {
            "ready": _saved(self._plan.ready()),
            "open": _saved(self._plan.left_open()),
            "counts": dict(self.counts),
        }

    def load_own_state(self, state: dict[str, Any]) -> None:
        blocks = {}
        for key in ("ready", "open"):
            with within(key):
                blocks[key] = _loaded(state[key])
        for key, block in blocks.items():
            fill = np.zeros(len(block), dtype=np.int64)
            if len(block):
                fill = np.add.reduceat(block.spans[:, LENGTH], block.offsets[:-1])
            most = self.capacity - (key == "open")  # an open line has room left
            over = np.flatnonzero(fill > most)
            if len(over):
                i = int(over[0])
                raise fail(
                    key,
                    f"line {i} holds {int(fill[i])} document tokens, more than the {most} "
                    f"that {'an open' if key == 'open' else 'a'} line of capacity "
                    f"{self.capacity} holds",
                )
        counts = need_mapping(state["counts"], "counts")
        need_keys(counts, "counts", COUNTS)
        self.counts = {key: need_count(counts[key], f"counts.{key}") for key in COUNTS}
        self._plan = _restored(blocks["ready"], blocks["open"])
        self._uncommitted = 0
        self._pending = Documents.empty()

    def settings(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "mode": "best_fit", "window": self.window}

    @classmethod
    def held_spans(cls, own: dict[str, Any]) -> np.ndarray:
        """The ready and the open lines' spans (every length written out)."""
        return np.concatenate([unpack_lines(own[key]).held() for key in ("ready", "open")])

    @classmethod
    def carry_over(
        cls, own: dict[str, Any], inputs: dict[str, Any], change: DatasetRenumbering
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        own = dict(own)
        for key in ("ready", "open"):
            saved = unpack_lines(own[key])
            spans = change.spans(saved.spans, f"best-fit packer {key} lines")
            renumbered = saved.renumbered(spans, change.number)
            own[key] = pack_lines(list(range(len(renumbered))), renumbered, to_end=False)
        return own, inputs

    @classmethod
    def relength(
        cls, own: dict[str, Any], change: LineChange, settings: dict[str, Any]
    ) -> dict[str, Any]:
        """Lines of another length: the pieces the stages above held (``change.pieces``,
        in the order they would have come), then this packer's ready lines, then its open
        ones, are placed best-fit-decreasing as one window at the new capacity
        (``settings["capacity"]``; the rule of ``fmsdata.stages.bestfitplan``: no piece
        that fits a line is cut). The full lines are ready, to be handed out first, in the
        order of their earliest piece; the others are left open for the next window. The
        counts go on (they cover the lines closed before the change)."""
        pieces = [restore_spans(np.asarray(p)[:, :SAVED_SPAN_WIDTH]) for p in change.take_pieces()]
        for key in ("ready", "open"):
            with within(key):
                pieces.append(restore_spans(unpack_lines(own[key]).spans))
        rows = np.ascontiguousarray(np.concatenate(pieces))
        if not len(rows):
            return own
        nothing = LineBlock.empty()
        spans, offsets, _, open_spans, open_offsets, _, _ = plan_best_fit(
            np.ascontiguousarray(nothing.spans),
            np.ascontiguousarray(nothing.offsets),
            rows,
            len(rows),
            int(settings["capacity"]),
        )
        return {
            **own,
            "ready": _saved(LineBlock(spans, offsets)),
            "open": _saved(LineBlock(open_spans, open_offsets)),
        }

    @classmethod
    def report(cls, own: dict[str, Any]) -> dict[str, Any]:
        """The lines held (ready and open, as unsent), the counts, and what ``state show``
        derives from them: the padding's share of the lines' document room and the mean
        document pieces per line."""
        return {
            "held": cls.held_spans(own),
            "held_as": "unsent",
            "counts": {key: int(own["counts"][key]) for key in COUNTS},
            "ratios": {
                "padding_fraction": ["padding_tokens", "line_tokens"],
                "documents_per_line": ["document_pieces", "lines"],
            },
        }


# The per-window figures of ``plan_best_fit`` (its ``STAT_*`` columns), by count name.
_STAT_COUNTS = ("lines", "padding_tokens", "document_pieces", "cut_documents")


def _rows(docs: Documents) -> np.ndarray:
    """Span rows ``(ds, file, doc, 0, dlen, dlen, base)``: each whole document."""
    rows = np.empty((len(docs), SPAN_WIDTH), dtype=np.int64)
    rows[:, DS] = docs.ds
    rows[:, FILE] = docs.file
    rows[:, DOC] = docs.doc
    rows[:, START] = 0
    rows[:, LENGTH] = docs.dlen
    rows[:, DLEN] = docs.dlen
    rows[:, BASE] = docs.base
    return rows


def _restored(ready: LineBlock, open_: LineBlock) -> _Plan:
    """A plan of one window already taken: ``ready`` lines to hand out, ``open_`` left open."""
    return _Plan(
        ready,
        [0, len(ready)],
        open_,
        [0, len(open_)],
        open_,
        np.zeros((1, 4), dtype=np.int64),
        entered=1,
    )


def _saved(block: LineBlock) -> dict[str, np.ndarray]:
    offsets = block.offsets
    return pack_rows(block.spans, offsets[:-1], np.diff(offsets), len(block), to_end=False)


def _loaded(saved: Any) -> LineBlock:
    """Saved lines read back strictly, as runtime spans (document facts unknown: the writer
    finds them again). Every length is written out: a length of 0 is refused."""
    lines = unpack_lines(saved)
    zero = np.flatnonzero(lines.spans[:, LENGTH] == 0)
    if len(zero):
        raise fail(f"length[{int(zero[0])}]", "must be at least 1 (the packer writes every length)")
    return LineBlock(restore_spans(lines.spans), lines.offsets)
