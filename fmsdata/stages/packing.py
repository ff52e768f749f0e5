"""Pack a document source's documents into fixed-length lines of spans.

``hard`` packing fills every line exactly, splitting documents across lines (the remainder
of a split document, the *carry*, starts the next line). ``pad`` packing never splits a
document that fits in a line: when the next document does not fit, the line is closed and
padded; only documents longer than a whole line are cut. Lines are planned for a whole
read-ahead block at once (one compiled pass for hard packing, ``kernels.plan_hard_lines``)
and handed out one at a time; each hand-out commits exactly the documents that started in
that line.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.stages.base import DatasetRenumbering, SpanStage
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
    carries: np.ndarray  # [lines, span width] carry after each line (length 0 = none)
    next_line: int = 0

    def __post_init__(self) -> None:
        # Handed out one line at a time: Python ints index faster than numpy scalars.
        self.bounds = self.offsets.tolist()
        self.started = self.commits.tolist()
        self.block = LineBlock(self.spans, self.offsets)

    @property
    def remaining(self) -> int:
        return len(self.started) - self.next_line


class LinePacker(SpanStage):
    """Yields packed lines as span arrays of total length ``capacity`` (hard) or less (pad).

    State keys: ``carry`` (the unused rest of a split document as a span, or an empty
    list) and ``source`` (the document source's state).

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
        self._carry: np.ndarray | None = None  # carry before the current plan's first line
        self._uncommitted = 0  # documents of handed-out lines not yet committed upstream
        self._plan: _Plan | None = None
        self._plan_carry: np.ndarray | None = None  # carry after the last planned line
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
        if type(self).__next__ is not LinePacker.__next__:
            return super().take(n)  # a subclass that changed __next__ is taken at its word
        return self._planned(n).lines()

    def take_lines(self, n: int) -> LineBlock:
        """The next ``n`` lines: views of the plans' spans (a stage that keeps lines copies
        them: the shuffle buffer into its store)."""
        if type(self).__next__ is not LinePacker.__next__ or type(self).take is not LinePacker.take:
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
    def carry(self) -> np.ndarray | None:
        """The unused rest of the document split by the last line handed out, if any."""
        plan = self._plan
        if plan is None or plan.next_line == 0:
            return self._carry
        carry = plan.carries[plan.next_line - 1]
        return carry if carry[LENGTH] > 0 else None

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
        carry = self.carry
        return {"carry": [] if carry is None else [int(v) for v in carry[:SAVED_SPAN_WIDTH]]}

    def load_own_state(self, state: dict[str, Any]) -> None:
        carry = [
            need_int(v, f"carry[{i}]", 1 if i == LENGTH else 0)
            for i, v in enumerate(need_list(state["carry"], "carry"))
        ]
        if len(carry) not in (0, SAVED_SPAN_WIDTH):
            raise StateMismatchError(
                f"carry: must be empty or {SAVED_SPAN_WIDTH} ints (a span), got {carry!r}"
            )
        self._carry = restore_spans(np.asarray([carry], dtype=np.int64))[0] if len(carry) else None
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
            spans = change.spans(np.asarray([carry]), "packer carry")
            own = {"carry": [int(v) for v in spans[0]]}
        return own, inputs

    @classmethod
    def held_spans(cls, own: dict[str, Any]) -> np.ndarray:
        return np.asarray(own["carry"], dtype=np.int64).reshape(-1, SAVED_SPAN_WIDTH)

    @classmethod
    def report(cls, own: dict[str, Any]) -> dict[str, Any]:
        """The carry: the unsent rest of a split document (its length is saved)."""
        return {"held": cls.held_spans(own), "held_as": "unsent"}


def _pieces(docs: Documents, carry: np.ndarray | None) -> tuple[np.ndarray, int]:
    """Rows ``(ds, file, doc, start, length)`` for the carry (if any) then each document,
    and how many leading rows are carry (0 or 1)."""
    rows = np.empty((len(docs), SPAN_WIDTH), dtype=np.int64)
    rows[:, DS] = docs.ds
    rows[:, FILE] = docs.file
    rows[:, DOC] = docs.doc
    rows[:, START] = 0
    rows[:, LENGTH] = docs.dlen
    rows[:, DLEN] = docs.dlen
    rows[:, BASE] = docs.base
    if carry is None:
        return rows, 0
    return np.concatenate([carry[None, :], rows]), 1


def _plan_hard(
    docs: Documents, carry: np.ndarray | None, capacity: int
) -> tuple[_Plan, Documents, np.ndarray | None]:
    rows, head = _pieces(docs, carry)
    spans, offsets, first_line, carries = plan_hard_lines(rows, capacity)
    n_lines = len(offsets) - 1
    if n_lines == 0:
        return _empty_plan(), docs, carry
    doc_first = first_line[head:]
    commits = np.bincount(doc_first[doc_first < n_lines], minlength=n_lines)
    started = np.flatnonzero(doc_first >= n_lines)
    pending = docs.take(int(started[0]) if started.size else len(docs))
    plan_carry = carries[-1] if carries[-1, LENGTH] > 0 else None
    return _Plan(spans, offsets, commits, carries), pending, plan_carry


def _plan_pad(
    docs: Documents, carry: np.ndarray | None, capacity: int
) -> tuple[_Plan, Documents, np.ndarray | None]:
    # Sequential by nature (whether a document fits depends on the line so far); one
    # Python step per document, which pad packing (mostly fine-tuning data) can afford.
    rows, head = _pieces(docs, carry)
    pieces: list[np.ndarray] = []
    offsets = [0]
    commits: list[int] = []
    carries: list[np.ndarray] = []
    fill = 0
    line_commits = 0
    open_row, open_carry = 0, carry  # what opened the unfinished line

    def close(after: np.ndarray | None) -> None:
        nonlocal fill, line_commits
        offsets.append(len(pieces))
        commits.append(line_commits)
        carries.append(np.zeros(SPAN_WIDTH, dtype=np.int64) if after is None else after)
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
            close(None)
        if fill == 0:
            open_row, open_carry = r, (row if r < head else None)
        if r >= head:
            line_commits += 1
        while length > capacity - fill:  # only a document longer than a whole line
            place(row, start, capacity)
            start, length = start + capacity, length - capacity
            rest = row.copy()
            rest[START], rest[LENGTH] = start, length
            close(rest)
            open_row, open_carry = r + 1, rest
        place(row, start, length)
        fill += length
        if fill == capacity:
            close(None)
            open_row, open_carry = r + 1, None
    if not commits:
        return _empty_plan(), docs, carry
    if fill == 0:
        open_row, open_carry = len(rows), None
    cut = max(int(open_row) - head, 0)
    pending = docs.take(cut)
    plan = _Plan(
        np.stack(pieces[: offsets[-1]]),
        np.asarray(offsets, dtype=np.int64),
        np.asarray(commits, dtype=np.int64),
        np.stack(carries),
    )
    return plan, pending, open_carry


def _empty_plan() -> _Plan:
    return _Plan(
        empty_spans(),
        np.zeros(1, dtype=np.int64),
        np.zeros(0, dtype=np.int64),
        np.zeros((0, SPAN_WIDTH), dtype=np.int64),
    )
