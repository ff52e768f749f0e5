"""Pack a document source's documents into fixed-length lines of spans.

``hard`` packing fills every line exactly, splitting documents across lines (the remainder
of a split document, the *carry*, starts the next line). ``pad`` packing never splits a
document that fits in a line: when the next document does not fit, the line is closed and
padded; only documents longer than a whole line are cut. Lines are planned for a whole
read-ahead block at once (one compiled pass for hard packing, ``kernels.plan_hard_lines``)
and handed out one at a time; each hand-out commits exactly the documents that started in
that line.

The carry is one span as a rule. After a change of line length on resume
(``allow_changes=["seq_length"]``, ``LinePacker.relength``) it holds every piece the saved
state held (the shuffle buffer's lines, then the packer's own carry), and the packer packs
them, at the new length, before the next document of its source: the carry is then a run of
spans until they are all in lines.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.stages.base import DatasetRenumbering, LineChange, SpanStage
from fmsdata.stages.kernels import plan_hard_lines
from fmsdata.stages.lineblock import LineBlock
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
    empty_spans,
    restore_spans,
)
from fmsdata.util.statecheck import need_int, need_list

__all__ = ["LinePacker"]


@dataclasses.dataclass
class _Plan:
    """Lines planned from read-ahead, handed out in order."""

    spans: np.ndarray  # [pieces, span width]
    offsets: np.ndarray  # [lines + 1] into spans
    commits: np.ndarray  # [lines] documents that start in each line
    carries: np.ndarray  # [lines, span width] the piece cut at each line's end (length 0 = none)
    # The carry the plan started from ([k, span width]) and, per line, the first of its rows
    # no line up to this one reached: those are carried on too (after the piece cut).
    head: np.ndarray = dataclasses.field(default_factory=empty_spans)
    head_next: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    next_line: int = 0

    def __post_init__(self) -> None:
        # Handed out one line at a time: Python ints index faster than numpy scalars.
        self.bounds = self.offsets.tolist()
        self.started = self.commits.tolist()
        self.block = LineBlock(self.spans, self.offsets)

    @property
    def remaining(self) -> int:
        return len(self.started) - self.next_line

    def carry_after(self, line: int) -> np.ndarray:
        """The carry after ``line`` (``[k, span width]``, k 0: none): the piece cut at its
        end, then the carried rows no line reached yet."""
        cut = self.carries[line : line + 1]
        cut = cut[cut[:, LENGTH] > 0]
        rest = self.head[int(self.head_next[line]) :] if len(self.head_next) else self.head[:0]
        return np.concatenate([cut, rest]) if len(rest) else cut


class LinePacker(SpanStage):
    """Yields packed lines as span arrays of total length ``capacity`` (hard) or less (pad).

    State keys: ``carry`` (the unused rest of a split document as a span of 5 ints, or an
    empty list; after a change of line length on resume, the pieces to pack first, 5 ints
    each, one after the other) and ``source`` (the document source's state).

    Args:
        source: Any document source (``fmsdata.stages.source``): the mixer, one
            dataset's stream, or a user's own.
        capacity: Document tokens per line (line length minus BOL/EOL).
        mode: ``"hard"`` or ``"pad"``.
    """

    role = "packer"

    def __init__(self, source: DocumentSource, capacity: int, mode: str = "hard"):
        if mode not in ("hard", "pad"):
            raise ConfigError(f"packing must be 'hard' or 'pad', got {mode!r}")
        if capacity < 1:
            raise ConfigError(f"a line needs room for at least one document token, got {capacity}")
        super().__init__(source)
        self.source: DocumentSource = source
        self.capacity = capacity
        self.mode = mode
        self._carry = empty_spans()  # carry before the current plan's first line ([k, width])
        self._uncommitted = 0  # documents of handed-out lines not yet committed upstream
        self._plan: _Plan | None = None
        self._plan_carry = empty_spans()  # carry after the last planned line
        self._pending = Documents.empty()  # read-ahead documents not yet in a planned line

    def __next__(self) -> np.ndarray:
        plan = self._plan
        while plan is None or not plan.remaining:
            plan = self._plan_more()
        j = plan.next_line
        plan.next_line += 1
        # Commits are only counted here and passed upstream when state is asked for:
        # nothing upstream needs them sooner.
        self._uncommitted += plan.started[j]
        return plan.spans[plan.bounds[j] : plan.bounds[j + 1]].copy()  # as ``take``: no view

    def take(self, n: int) -> list[np.ndarray]:
        if self._changed_from(LinePacker, "__next__"):
            return super().take(n)  # a subclass that changed __next__ is taken at its word
        return self._planned(n).lines()

    def take_lines(self, n: int) -> LineBlock:
        """The next ``n`` lines: views of the plans' spans (a stage that keeps lines copies
        them: the shuffle buffer into its store)."""
        if self._changed_from(LinePacker, "__next__", "take"):
            return super().take_lines(n)  # a subclass is taken at its word
        return self._planned(n)

    def _planned(self, n: int) -> LineBlock:
        blocks: list[LineBlock] = []
        taken = 0
        while taken < n:
            plan = self._plan
            while plan is None or not plan.remaining:
                plan = self._plan_more()
            j = plan.next_line
            k = min(n - taken, plan.remaining)
            blocks.append(plan.block.slice(j, j + k))
            self._uncommitted += sum(plan.started[j : j + k])
            plan.next_line = j + k
            taken += k
        return LineBlock.concat(blocks)

    @property
    def carry(self) -> np.ndarray:
        """What the next line starts with (``[k, span width]``, k 0: nothing): the unused
        rest of the document split by the last line handed out, or after a change of line
        length the pieces not packed yet."""
        plan = self._plan
        if plan is None or plan.next_line == 0:
            return self._carry
        return plan.carry_after(plan.next_line - 1)

    def _plan_more(self) -> _Plan:
        self._carry = self.carry
        self._plan = self._next_plan()
        return self._plan

    def _next_plan(self) -> _Plan:
        docs = self._pending.then(self.source.read_ahead())
        if self.mode == "hard":
            plan, self._pending, self._plan_carry = _plan_hard(
                docs, self._plan_carry, self.capacity
            )
        else:
            plan, self._pending, self._plan_carry = _plan_pad(docs, self._plan_carry, self.capacity)
        return plan

    def own_state(self) -> dict[str, Any]:
        # Runs before the source's state is taken (``Stage.state_dict``): the documents of
        # the lines handed out are committed to it first.
        if self._uncommitted:
            self.source.commit(self._uncommitted)
            self._uncommitted = 0
        return {"carry": _saved_carry(self.carry)}

    def load_own_state(self, state: dict[str, Any]) -> None:
        carry = [
            need_int(v, f"carry[{i}]", 1 if i % SAVED_SPAN_WIDTH == LENGTH else 0)
            for i, v in enumerate(need_list(state["carry"], "carry"))
        ]
        if len(carry) % SAVED_SPAN_WIDTH:
            raise StateMismatchError(
                f"carry: must be empty or spans of {SAVED_SPAN_WIDTH} ints each, got {carry!r}"
            )
        self._carry = restore_spans(np.asarray(carry, dtype=np.int64).reshape(-1, SAVED_SPAN_WIDTH))
        self._uncommitted = 0
        self._plan = None
        self._plan_carry = self._carry
        self._pending = Documents.empty()

    def settings(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "mode": self.mode}

    @classmethod
    def carry_over(
        cls, own: dict[str, Any], inputs: dict[str, Any], change: DatasetRenumbering
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        carry = own["carry"]
        if carry:
            spans = change.spans(np.asarray(carry), "packer carry")
            own = {"carry": [int(v) for v in spans.ravel()]}
        return own, inputs

    @classmethod
    def relength(
        cls, own: dict[str, Any], change: LineChange, settings: dict[str, Any]
    ) -> dict[str, Any]:
        """Lines of another length: the pieces the stages above held (``change.pieces``,
        in the order they would have come) and then this packer's own carry become the
        carry, packed at the new capacity before the next document."""
        saved = np.asarray(own["carry"], dtype=np.int64).reshape(-1, SAVED_SPAN_WIDTH)
        pieces = [piece[:, :SAVED_SPAN_WIDTH] for piece in change.take_pieces()]
        return {"carry": _saved_carry(np.concatenate([*pieces, saved]))}

    @classmethod
    def held_spans(cls, own: dict[str, Any]) -> np.ndarray:
        return np.asarray(own["carry"], dtype=np.int64).reshape(-1, SAVED_SPAN_WIDTH)

    @classmethod
    def report(cls, own: dict[str, Any]) -> dict[str, Any]:
        """The carry: the unsent rest of a split document (its length is saved)."""
        return {"held": cls.held_spans(own), "held_as": "unsent"}


def _saved_carry(carry: np.ndarray) -> list[int]:
    """A carry (``[k, span width]``) as its state keeps it: 5 ints a span, one after another."""
    return [int(v) for v in carry[:, :SAVED_SPAN_WIDTH].ravel()]


def _pieces(docs: Documents, carry: np.ndarray) -> tuple[np.ndarray, int]:
    """Rows ``(ds, file, doc, start, length)`` for the carry then each document, and how
    many leading rows are carry."""
    rows = np.empty((len(docs), SPAN_WIDTH), dtype=np.int64)
    rows[:, DS] = docs.ds
    rows[:, FILE] = docs.file
    rows[:, DOC] = docs.doc
    rows[:, START] = 0
    rows[:, LENGTH] = docs.dlen
    rows[:, DLEN] = docs.dlen
    rows[:, BASE] = docs.base
    if not len(carry):
        return rows, 0
    return np.concatenate([carry, rows]), len(carry)


def _plan_hard(
    docs: Documents, carry: np.ndarray, capacity: int
) -> tuple[_Plan, Documents, np.ndarray]:
    rows, head = _pieces(docs, carry)
    spans, offsets, first_line, carries = plan_hard_lines(rows, capacity)
    n_lines = len(offsets) - 1
    if n_lines == 0:
        return _empty_plan(), docs, carry
    doc_first = first_line[head:]
    commits = np.bincount(doc_first[doc_first < n_lines], minlength=n_lines)
    started = np.flatnonzero(doc_first >= n_lines)
    pending = docs.take(int(started[0]) if started.size else len(docs))
    head_next = np.zeros(0, dtype=np.int64)
    if head > 1:  # a carry of several pieces: which of them each line reached
        head_next = np.searchsorted(first_line[:head], np.arange(n_lines), side="right")
    plan = _Plan(spans, offsets, commits, carries, carry if head > 1 else empty_spans(), head_next)
    return plan, pending, plan.carry_after(n_lines - 1)


def _plan_pad(
    docs: Documents, carry: np.ndarray, capacity: int
) -> tuple[_Plan, Documents, np.ndarray]:
    # Sequential by nature (whether a document fits depends on the line so far); one
    # Python step per document, which pad packing (mostly fine-tuning data) can afford.
    rows, head = _pieces(docs, carry)
    pieces: list[np.ndarray] = []
    offsets = [0]
    commits: list[int] = []
    carries: list[np.ndarray] = []
    head_next: list[int] = []  # per line, the first carry row it did not reach
    fill = 0
    line_commits = 0
    # What opened the unfinished line: its first row, or the rest of a cut row (then the
    # row after it is the first row not placed).
    open_row, open_rest = 0, None

    def close(after: np.ndarray | None, next_row: int) -> None:
        nonlocal fill, line_commits
        offsets.append(len(pieces))
        commits.append(line_commits)
        carries.append(np.zeros(SPAN_WIDTH, dtype=np.int64) if after is None else after)
        head_next.append(next_row)
        fill = 0
        line_commits = 0

    def place(row: np.ndarray, start: int, length: int) -> None:
        piece = row.copy()
        piece[START], piece[LENGTH] = start, length
        pieces.append(piece)

    for r in range(len(rows)):
        row = rows[r]
        start, length = int(row[START]), int(row[LENGTH])
        if fill and length > capacity - fill:
            close(None, r)
        if fill == 0:
            open_row, open_rest = r, None
        if r >= head:
            line_commits += 1
        while length > capacity - fill:  # only a document longer than a whole line
            place(row, start, capacity)
            start, length = start + capacity, length - capacity
            rest = row.copy()
            rest[START], rest[LENGTH] = start, length
            close(rest, r + 1)
            open_row, open_rest = r + 1, rest
        place(row, start, length)
        fill += length
        if fill == capacity:
            close(None, r + 1)
            open_row, open_rest = r + 1, None
    if not commits:
        return _empty_plan(), docs, carry
    if fill == 0:
        open_row, open_rest = len(rows), None
    cut = max(int(open_row) - head, 0)
    pending = docs.take(cut)
    several = head > 1
    plan = _Plan(
        np.stack(pieces[: offsets[-1]]),
        np.asarray(offsets, dtype=np.int64),
        np.asarray(commits, dtype=np.int64),
        np.stack(carries),
        rows[:head].copy() if several else empty_spans(),
        np.minimum(np.asarray(head_next, dtype=np.int64), head)
        if several
        else np.zeros(0, np.int64),
    )
    # The unfinished line is planned again: its opening rest, then every carry row from
    # the first it holds.
    left = rows[open_row:head]
    plan_carry = left if open_rest is None else np.concatenate([open_rest[None, :], left])
    return plan, pending, plan_carry


def _empty_plan() -> _Plan:
    return _Plan(
        empty_spans(),
        np.zeros(1, dtype=np.int64),
        np.zeros(0, dtype=np.int64),
        np.zeros((0, SPAN_WIDTH), dtype=np.int64),
    )
