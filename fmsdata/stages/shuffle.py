"""A shuffle buffer over packed lines, held as spans.

The buffer fills two lines per step until it holds ``window`` lines, then one per step;
each step hands out the line at a stateless pseudo-random slot (a hash of the shard key
and the step count), so the only randomness state is the step count. Lines are spans,
so the saved buffer is a few integers per line however long the lines are (and fewer
still in its saved form, ``fmsdata.stages.savedlines``: a resume measures the documents'
lengths again from the files, ``documents``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.stages.base import DatasetRenumbering, LineChange, SpanStage
from fmsdata.stages.deferred import made
from fmsdata.stages.lineblock import LineBlock
from fmsdata.stages.linestore import RESTORED, LineStore
from fmsdata.stages.savedlines import (
    DocumentLengths,
    PackedLater,
    SavedLines,
    pack_lines,
    resolve,
    unpack_lines,
)
from fmsdata.stages.spans import LENGTH
from fmsdata.util.compiled import compiled
from fmsdata.util.permute import hash_array
from fmsdata.util.statecheck import need_count, within

__all__ = ["ShuffleBuffer", "BUFFER_KEY"]

BUFFER_KEY = "buffer"  # where a shuffle buffer's own state keeps its lines


class ShuffleBuffer(SpanStage):
    """Hands out packed lines in a window-local random order.

    State keys: ``emitted`` (lines handed out), ``buffer`` (the lines in their saved form,
    ``fmsdata.stages.savedlines``) and ``source`` (packer state).

    Args:
        source: The lines to shuffle (a span stage).
        window: Lines held at most; 0 or 1 passes lines through in order.
        key: Shuffle key (derived from seed and logical shard).
        documents: Where restored lines find their documents' lengths; a shard's
            pipeline (``fmsdata.worker.chain.build_pipeline``) sets it on every shuffle
            buffer of its chain. Without it lines are saved with every length.
    """

    role = "shuffle"

    def __init__(
        self,
        source: SpanStage,
        window: int,
        key: int,
        documents: DocumentLengths | None = None,
    ):
        super().__init__(source)
        self.window = window
        self.documents = documents
        self._open = False  # some restored span has no length (its dataset is not here)
        self.key = key
        self.emitted = 0
        # The held lines; a restored line (of ``_restored``, a loaded state) is measured
        # against its files when it is handed out, so loading a state opens no file (see
        # ``measure_restored``).
        self._store = LineStore(window)
        self._restored: SavedLines | None = None

    @property
    def buffer(self) -> list[np.ndarray | int]:
        """The held lines in slot order: span arrays (views: read, do not keep), or ints:
        lines of a loaded state not measured yet."""
        return self._store.lines()

    def __next__(self) -> np.ndarray:
        return self._take_block(1).line(0).copy()

    def take(self, n: int) -> list[np.ndarray]:
        if self._changed_from(ShuffleBuffer, "__next__"):
            return super().take(n)  # a subclass that changed __next__ is taken at its word
        return self._take_block(n).lines()

    def take_lines(self, n: int) -> LineBlock:
        if self._changed_from(ShuffleBuffer, "__next__", "take"):
            return super().take_lines(n)  # a subclass is taken at its word
        return self._take_block(n)

    def _take_block(self, n: int) -> LineBlock:
        if self.window <= 1:
            self.emitted += n
            return _pull(self.source, n)
        # The source's lines do not depend on the slots taken: the lines the n steps push
        # are pulled in one call, then one compiled pass makes the steps on the slots.
        store = self._store
        pushed = _pull(self.source, _pushes(len(store), self.window, n))
        start, count = store.steps(pushed, hash_array(self.key, self.emitted, n), self.window)
        self.emitted += n
        if (count == RESTORED).any():
            out = self._with_restored(start, count)
        else:
            out = store.gather(start, count)
        if self._open and not out.spans[:, LENGTH].all():
            raise self._unmeasured()
        return out

    def _with_restored(self, start: np.ndarray, count: np.ndarray) -> LineBlock:
        """The lines handed out, restored ones among them measured now."""
        rows = self._store.rows
        return LineBlock.of(
            [
                self._measure(a) if n == RESTORED else rows[a : a + n]
                for a, n in zip(start.tolist(), count.tolist())
            ]
        )

    def _unmeasured(self) -> StateMismatchError:
        return StateMismatchError(
            "shuffle buffer: a restored line runs to the end of a document whose length is "
            "not known here (its dataset has no files in this chain, or the chain was not "
            "built by fmsdata.worker.chain.build_pipeline)"
        )

    def own_state(self) -> dict[str, Any]:
        return made(self._own_state_deferred())

    def _own_state_deferred(self) -> dict[str, Any]:
        """The own state with the buffer's lines a snapshot, packed when made."""
        if self._open:
            raise self._unmeasured()
        rows, start, count = self._store.snapshot()
        lines = PackedLater(rows, start, count, self._restored, self.documents is not None)
        return {"emitted": self.emitted, BUFFER_KEY: lines}

    def load_own_state(self, state: dict[str, Any]) -> None:
        self.emitted = need_count(state["emitted"], "emitted")
        with within(BUFFER_KEY):
            saved = unpack_lines(state[BUFFER_KEY])
            lines: list[np.ndarray | int]
            if self.documents is None:
                resolved, self._open = resolve(saved, None)
                lines, self._restored = list(resolved), None
            else:
                lines, self._open, self._restored = list(range(len(saved))), False, saved
        if len(lines) > max(self.window, 0):
            raise StateMismatchError(
                f"shuffle buffer state holds {len(lines)} lines, more than "
                f"shuffle_window={self.window}"
            )
        self._store.reset(lines)

    def measure_restored(self) -> None:
        """Measure every restored line now against its files (which opens them; a remote
        root downloads them): what a resume's checks call where opening files is cheap,
        so a state that does not fit the data is refused before anything runs.

        Raises:
            StateMismatchError: A restored span does not fit its document, or a line's
                tokens differ from its saved counts (path relative to the buffer).
        """
        if self._restored is None:
            return
        with within(BUFFER_KEY):
            lines, self._open = resolve(self._restored, self.documents)
        self._store.reset(
            [lines[line] if not isinstance(line, np.ndarray) else line for line in self.buffer]
        )
        self._restored = None

    def _measure(self, line: int) -> np.ndarray:
        """Restored line ``line``, measured against its files as it is handed out (its
        file is read now anyway)."""
        saved = self._restored
        assert saved is not None, "restored lines come with their saved form"
        a, b = int(saved.offsets[line]), int(saved.offsets[line + 1])
        one = SavedLines(saved.spans[a:b], np.array([0, b - a]), saved.tokens[line : line + 1])
        with within(f"{BUFFER_KEY} (restored line {line})"):
            lines, still_open = resolve(one, self.documents)
        if still_open:
            self._open = True
        return lines[0]

    def settings(self) -> dict[str, Any]:
        return {"window": self.window}

    @classmethod
    def carry_over(
        cls, own: dict[str, Any], inputs: dict[str, Any], change: DatasetRenumbering
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        saved = unpack_lines(own[BUFFER_KEY])
        moved = saved.renumbered(change.spans(saved.held(), "shuffle buffer"), change.number)
        return {**own, BUFFER_KEY: pack_lines(range(len(moved)), moved)}, inputs

    @classmethod
    def relength(
        cls, own: dict[str, Any], change: LineChange, settings: dict[str, Any]
    ) -> dict[str, Any]:
        """Lines of another length: the buffered lines' spans are handed on, in slot order,
        to be re-packed by the packer below (their lengths found from the files); the
        buffer starts empty and fills again as at the start of a run (two lines a step),
        its count of lines handed out (the shuffle's clock) going on."""
        with within(BUFFER_KEY):
            lines, unmeasured = resolve(unpack_lines(own[BUFFER_KEY]), change.documents)
        if unmeasured:
            raise StateMismatchError(
                f"{BUFFER_KEY}: a buffered line runs to the end of a document of a dataset "
                "with no files here: it cannot be re-packed to another seq_length"
            )
        for line in lines:
            change.give(line)
        return {**own, BUFFER_KEY: pack_lines([])}

    @classmethod
    def held_spans(cls, own: dict[str, Any]) -> np.ndarray:
        with within(BUFFER_KEY):
            return unpack_lines(own[BUFFER_KEY]).held()

    @classmethod
    def report(cls, own: dict[str, Any]) -> dict[str, Any]:
        """The buffered lines (their spans, and their tokens per dataset from the saved
        counts: most spans run to their document's end without a length) and the lines
        this buffer handed out."""
        with within(BUFFER_KEY):
            saved = unpack_lines(own[BUFFER_KEY])
        return {
            "held": saved.held(),
            "held_tokens": saved.tokens.sum(axis=0).tolist(),
            "held_as": "buffered",
            "counts": {"lines buffered": len(saved), "lines handed out": int(own["emitted"])},
        }


def _pull(source: Any, n: int) -> LineBlock:
    """``n`` lines of ``source``: one ``take_lines`` from a span stage, else one ``next``
    each.

    Raises:
        ConfigError: The source's ``take``/``take_lines`` gave another number of lines.
    """
    if not isinstance(source, SpanStage):
        return LineBlock.of([next(source) for _ in range(n)])
    lines = source.take_lines(n)
    if len(lines) != n:
        raise ConfigError(
            f"{source.name}.take_lines({n}) gave {len(lines)} lines: a span stage's take "
            "and take_lines give exactly the lines asked for"
        )
    return lines


@compiled
def _pushes(size: int, window: int, steps: int) -> int:
    """Lines ``steps`` steps push into a buffer holding ``size``: two a step while below
    ``window``, then one (each step hands one out)."""
    total = 0
    for _ in range(steps):
        push = min(2, max(window - size, 0))
        total += push
        size += push - 1
    return total
