"""One logical shard's chain as a worker runs it: built by the stage factory, loaded from
a saved state and checked against the data, fast-forwarded at span level.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fmsdata.config import (
    Decoration,
)
from fmsdata.errors import ConfigError
from fmsdata.stages.base import SpanStage, Stage, TokenStage, layout, walk
from fmsdata.stages.lineblock import LineBlock
from fmsdata.stages.outputs import TokenLine
from fmsdata.stages.savedchain import held_spans, saved_stages
from fmsdata.stages.savedlines import DocumentLengths
from fmsdata.stages.shard import Shard, ShardRecipe, StageFactory, default_stages
from fmsdata.util.statecheck import need_count, need_keys, within
from fmsdata.worker.spancheck import check_saved_spans

__all__ = ["ShardPipeline", "build_pipeline", "open_shard"]

_REPLAY_CHUNK = 4096  # lines pulled at a time when a shard fast-forwards at span level


class ShardPipeline:
    """One logical shard's chain as a worker runs it: lines from the span-level part, the
    token-level stages on top (applied after materialization), and the lines emitted.

    State: ``{"emitted": lines handed out, "stages": the chain's state}``.
    """

    def __init__(self, top: Stage):
        if not isinstance(top, Stage):
            raise ConfigError(f"a stage factory must return a Stage, got {type(top).__name__}")
        self.top = top
        token_stages: list[TokenStage] = []
        lines: Stage = top
        while isinstance(lines, TokenStage):
            token_stages.append(lines)
            lines = lines.source
        if not isinstance(lines, SpanStage):
            raise ConfigError(
                f"a chain must end in a span-level stage that yields lines (the packer or a "
                f"stage reading it), found {type(lines).__name__}"
            )
        self.lines = lines
        self.token_stages = token_stages[::-1]  # in the order they apply
        self.emitted = 0

    def __iter__(self) -> ShardPipeline:
        return self

    def __next__(self) -> np.ndarray:
        line = next(self.lines)
        self.emitted += 1
        return line

    def take(self, n: int) -> list[np.ndarray]:
        """The next ``n`` lines at once (as ``n`` calls of ``next``)."""
        lines = self.lines.take(n)
        self.emitted += n
        return lines

    def take_lines(self, n: int) -> LineBlock:
        """The next ``n`` lines as one block (``SpanStage.take_lines``).

        Raises:
            ConfigError: The chain's last span stage gave another number of lines.
        """
        lines = self.lines.take_lines(n)
        if len(lines) != n:
            raise ConfigError(
                f"{self.lines.name}.take_lines({n}) gave {len(lines)} lines: a span stage's "
                "take and take_lines give exactly the lines asked for"
            )
        self.emitted += n
        return lines

    def apply_tokens(self, row: np.ndarray, content: int, line: TokenLine) -> int:
        """Run the token-level stages over one materialized line (in place); ``line``'s
        pieces follow what they did."""
        for stage in self.token_stages:
            content = int(stage.apply(row, content, line))
            if not 0 <= content <= len(row) or int(line.pieces.sum()) != content:
                raise ConfigError(
                    f"token stage {stage.name} returned content {content} for a line of "
                    f"{len(row)} tokens whose pieces sum to {int(line.pieces.sum())}: they "
                    "must agree (set line.pieces and line.ids when moving tokens)"
                )
            if len(line.pieces) != len(line.ids):
                raise ConfigError(
                    f"token stage {stage.name} left {len(line.pieces)} pieces but "
                    f"{len(line.ids)} document ids"
                )
        return content

    def state_dict(self, deferred: bool = False) -> dict[str, Any]:
        """The shard's state (``deferred``: see ``Stage.state_dict``)."""
        return {"emitted": self.emitted, "stages": self.top.state_dict(deferred)}

    def load_state_dict(self, state: Any, where: str = "shard state") -> None:
        """Load a ``state_dict()`` strictly: each stage reads its own part; a
        StateMismatchError names the path inside the state under ``where``."""
        with within(where):
            need_keys(state, "", ("emitted", "stages"))
            self.emitted = need_count(state["emitted"], "emitted")
            with within("stages"):
                self.top.load_state_dict(state["stages"])

    def check_restored(
        self, state: Any, accesses: Sequence[Any], decoration: Decoration, measure: bool, where: str
    ) -> None:
        """A loaded state checked against the data before the shard runs (each document
        stream checked its position as it loaded): each restored buffered line against its
        files (``measure_restored``, only where opening files is cheap: ``measure``), and
        every saved span's dataset, file, document and end (``fmsdata.worker.spancheck``; a
        remote root checks a span's end when its file arrives to be read).

        Raises:
            StateMismatchError: Naming the path under ``where`` and the value.
        """
        with within(where):
            for path, stage in walk(self.top):
                restored = getattr(stage, "measure_restored", None)
                if measure and callable(restored):
                    with within(".".join(["stages", *path])):
                        restored()
            check_saved_spans(
                held_spans(saved_stages(self.layout(), state["stages"])),
                "",
                [access.name for access in accesses],
                {access.name: access for access in accesses},
                decoration,
                measure,
            )

    def layout(self) -> list[dict[str, Any]]:
        return layout(self.top)

    def prefetch_upcoming(self) -> None:
        """Let remote roots start downloading the first file each document stream reads."""
        for _, stage in walk(self.top):
            if stage.role == "dataset":
                stage.prefetch_upcoming()  # type: ignore[attr-defined]


def build_pipeline(
    shard: int, recipe: ShardRecipe, accesses: Sequence, factory: StageFactory | None = None
) -> ShardPipeline:
    """A fresh chain of one logical shard (load a state into it to resume). Its shuffle
    buffers find the lengths of restored lines' documents in ``accesses``."""
    pipeline = ShardPipeline((factory or default_stages)(Shard(shard, recipe, accesses)))
    for _, stage in walk(pipeline.top):
        if stage.role == "shuffle" and getattr(stage, "documents", False) is None:
            setattr(stage, "documents", DocumentLengths(accesses, recipe.decoration))  # noqa: B010
    return pipeline


def open_shard(
    shard: int,
    recipe: ShardRecipe,
    accesses: Sequence,
    state: Any = None,
    advance: int = 0,
    factory: StageFactory | None = None,
    writer: Any = None,
    where: str = "",
    measure: bool = True,
) -> ShardPipeline:
    """A shard's pipeline at a saved position: ``state`` (None = start) plus ``advance``
    lines emitted after it, which are replayed at span level (no tokens are read, unless
    token-level stages must see them: then ``writer`` materializes them).

    A loaded state is checked against the data (``ShardPipeline.check_restored``, with
    ``measure``); errors name the path ``where`` (default: the logical shard).
    """
    pipeline = build_pipeline(shard, recipe, accesses, factory)
    if state is not None:
        where = where or f"logical shard {shard}"
        pipeline.load_state_dict(state, where)
        pipeline.check_restored(state, accesses, recipe.decoration, measure, where)
    pipeline.prefetch_upcoming()
    if pipeline.token_stages and advance:
        if writer is None:
            raise ConfigError("replaying token-level stages needs the line writer")
        row = np.empty((1, writer.line_length), dtype=np.int32)
        for _ in range(advance):
            spans = next(pipeline)
            content = writer.write([spans], row)
            line = TokenLine.of(spans, writer.bol is not None, writer.eol is not None)
            pipeline.apply_tokens(row[0], int(content[0]), line)
    else:
        for done in range(0, advance, _REPLAY_CHUNK):
            pipeline.take_lines(min(_REPLAY_CHUNK, advance - done))
    return pipeline
