"""Which stage of a logical shard's chain breaks exact resume: the blame ``fmsdata verify``
gives when two runs that should agree do not.

A chain is built with the user's own stage factory from the ``Shard`` the loader handed
it (``fmsdata.verify.runs`` keeps those), as many times as needed. Each stage is then asked,
inputs before the stages that read them, two questions about its next outputs:

- **Fresh chains agree?** Two chains built alike give the same outputs. A stage whose
  outputs differ while its inputs' agree draws from something the seed does not fix
  (``random.random()``, the clock, a global generator).
- **A saved and loaded chain continues?** A chain run some lines, its state saved (through
  a state file's encoding) and loaded into a fresh chain: both give the same next outputs.
  A stage whose outputs differ while its inputs' agree keeps something its state lacks.

A stage's outputs are what its kind hands on: a span stage's lines (the saved columns of
their spans), a document source's documents (dataset, file, document, length), a token
stage's tokens of the materialized lines it changed. Asking a stage alone (not through
the top of the chain) leaves the stages above it out, which is what makes the first stage
that fails the culprit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from fmsdata.stages.base import SpanStage, Stage, TokenStage, walk
from fmsdata.stages.outputs import TokenLine
from fmsdata.stages.shard import Shard
from fmsdata.stages.source import DocumentSource
from fmsdata.stages.spans import SAVED_SPAN_WIDTH
from fmsdata.state.file import state_from_bytes, state_to_bytes
from fmsdata.worker.chain import ShardPipeline, build_pipeline
from fmsdata.worker.materialize import LineWriter

__all__ = ["Blame", "blame_shard"]

_OUTPUTS = 12  # outputs of a stage compared per question


@dataclasses.dataclass(frozen=True)
class Blame:
    """A stage found to break exactness.

    Attributes:
        shard: The logical shard whose chain showed it.
        path: Keys leading to the stage in the shard's state (empty: the top).
        stage: The stage's class, ``module.QualName``.
        why: Which question it failed, in words.
    """

    shard: int
    path: tuple[str, ...]
    stage: str
    why: str

    def describe(self) -> str:
        where = "/".join(self.path) if self.path else "the top of the chain"
        return f"stage {self.stage} (at {where}, logical shard {self.shard}): {self.why}"


def blame_shard(
    shard: Shard,
    factory: Callable[[Shard], Stage] | None,
    writer: LineWriter,
    lines_before: list[int],
) -> Blame | None:
    """The first stage of ``shard``'s chain (inputs first) that fails either question,
    after each of ``lines_before`` lines of the whole chain for the second; None if every
    stage passes."""

    def build() -> ShardPipeline:
        return build_pipeline(shard.id, shard.recipe, shard.accesses, factory)

    probe = build()
    order = list(walk(probe.top))[::-1]  # inputs before the stages that read them
    for path, stage in order:
        if _kind(stage) is None:
            continue
        cls = f"{type(stage).__module__}.{type(stage).__qualname__}"
        first = _outputs(build(), path, writer)
        if first != _outputs(build(), path, writer):
            why = (
                "two chains built alike give different outputs from it while its inputs "
                "agree: it draws from something the seed does not fix (random.random(), "
                "the clock, a global generator); draw from a generator keyed by the shard "
                "(Shard.key) and keep its position in its state"
            )
            return Blame(shard.id, path, cls, why)
        for lines in lines_before:
            ran = build()
            _advance(ran, lines, writer)
            state = state_from_bytes(state_to_bytes(ran.state_dict()))
            resumed = build()
            resumed.load_state_dict(state)
            if _outputs(ran, path, writer) != _outputs(resumed, path, writer):
                why = (
                    f"saved after {lines} line(s) of the shard and loaded into a fresh chain, "
                    "its next outputs differ while its inputs' agree: its state "
                    "(own_state/load_own_state) does not hold all it depends on"
                )
                return Blame(shard.id, path, cls, why)
    return None


def _kind(stage: Stage) -> str | None:
    if isinstance(stage, TokenStage):
        return "tokens"
    if isinstance(stage, SpanStage):
        return "lines"
    if isinstance(stage, DocumentSource):
        return "documents"
    return None


def _outputs(pipeline: ShardPipeline, path: tuple[str, ...], writer: LineWriter) -> list[Any]:
    """The next outputs of the stage at ``path`` of a chain, as comparable values."""
    stage = dict(walk(pipeline.top))[path]
    kind = _kind(stage)
    if kind == "lines":
        return [_line_key(next(stage)) for _ in range(_OUTPUTS)]
    if kind == "documents":
        out: list[Any] = []
        source: Any = stage
        source.rewind()  # from its first document not committed (what its state says)
        while len(out) < _OUTPUTS:
            block = source.read_ahead()
            n = min(len(block), _OUTPUTS - len(out))
            rows = np.stack([block.ds, block.file, block.doc, block.dlen], axis=1)[:n]
            out.extend(tuple(r) for r in rows.tolist())
            source.commit(n)
        return out
    # A token stage: the lines of the span stage below the token stages, materialized,
    # through the token stages up to this one.
    below = []
    for token_stage in pipeline.token_stages:
        below.append(token_stage)
        if token_stage is stage:
            break
    return [_token_line(pipeline, below, writer) for _ in range(_OUTPUTS)]


def _line_key(line: np.ndarray) -> tuple[int, ...]:
    spans = np.asarray(line, dtype=np.int64)[:, :SAVED_SPAN_WIDTH]
    return tuple(spans.ravel().tolist())


def _written(spans: np.ndarray, writer: LineWriter) -> tuple[np.ndarray, int, TokenLine]:
    """A line of spans materialized as a worker writes it: its row, content and token line."""
    row = np.empty((1, writer.line_length), dtype=np.int32)
    content = int(writer.write([spans], row)[0])
    return row[0], content, TokenLine.of(spans, writer.bol is not None, writer.eol is not None)


def _token_line(pipeline: ShardPipeline, stages: list[TokenStage], writer: LineWriter) -> Any:
    row, content, line = _written(next(pipeline.lines), writer)
    for stage in stages:
        content = int(stage.apply(row, content, line))
    return (content, tuple(row[:content].tolist()))


def _advance(pipeline: ShardPipeline, lines: int, writer: LineWriter) -> None:
    """Run the whole chain ``lines`` lines, token stages included (as a worker does)."""
    for _ in range(lines):
        spans = next(pipeline)
        if pipeline.token_stages:
            pipeline.apply_tokens(*_written(spans, writer))
