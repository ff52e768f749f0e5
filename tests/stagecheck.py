"""The resume/rescale checker every stage's tests run.

``check_stage_resume`` runs a chain, saves at many points (through a state file's bytes,
so the state is plain data), loads each save into a freshly built chain and compares what
follows with the uninterrupted run, span for span (spans name the tokens exactly, so this
is token for token). ``check_stage_rescale`` runs every logical shard's chain as ranks of
one world size would, saves, re-deals the shards over another world size and checks the
global steps that follow equal those of the uninterrupted run.

Token-level stages are checked through ``TokenLines``: the chain's lines materialized and
run through its token stages, compared token for token (and piece for piece).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from fmsdata.stages.base import Stage, TokenStage
from fmsdata.stages.outputs import TokenLine
from fmsdata.stages.spans import SAVED_SPAN_WIDTH
from fmsdata.state.file import state_from_bytes, state_to_bytes
from fmsdata.worker.materialize import LineWriter
from fmsdata.worker.topology import RowDealer, owned_shards


def line_key(line: np.ndarray | tuple) -> tuple[int, ...]:
    """A line by the saved span columns (document facts may be unknown after a resume);
    a ``TokenLines`` line is its own key."""
    if isinstance(line, tuple):
        return line
    return tuple(np.asarray(line)[:, :SAVED_SPAN_WIDTH].reshape(-1).tolist())


class TokenLines(Stage):
    """A chain whose top is token-level, as lines of tokens: each line of its span-level
    part is materialized by ``writer`` and run through its token stages, in order (as a
    worker does). ``__next__`` gives ``(tokens..., pieces..., ids...)`` of the line."""

    def __init__(self, top: Stage, writer: LineWriter):
        self.top = top
        self.writer = writer
        stages = []
        lines = top
        while isinstance(lines, TokenStage):
            stages.append(lines)
            lines = lines.source
        self.lines = lines
        self.stages = stages[::-1]

    def children(self) -> dict[str, Stage]:
        return {"source": self.top}

    def __next__(self) -> tuple:
        spans = next(self.lines)
        row = np.zeros((1, self.writer.line_length), dtype=np.int32)
        content = int(self.writer.write([spans], row)[0])
        line = TokenLine.of(spans, self.writer.bol is not None, self.writer.eol is not None)
        for stage in self.stages:
            content = stage.apply(row[0], content, line)
        assert int(line.pieces.sum()) == content
        return (
            *row[0, :content].tolist(),
            -1,
            *line.pieces.tolist(),
            -1,
            *line.ids.tolist(),
        )


def lines(stage: Stage, n: int) -> list[tuple[int, ...]]:
    return [line_key(next(stage)) for _ in range(n)]


def saved(stage: Stage) -> dict:
    """The stage's state as a state file gives it back."""
    return state_from_bytes(state_to_bytes(stage.state_dict()))


def check_stage_resume(build: Callable[[], Stage], total: int, points: Iterable[int]) -> None:
    """For each ``k`` in ``points``: run a fresh chain ``k`` lines, save, resume in another
    fresh chain; the lines that follow equal the uninterrupted run's."""
    reference = lines(build(), total)
    for k in points:
        head = build()
        assert lines(head, k) == reference[:k], f"a fresh chain differs before {k}"
        state = saved(head)
        resumed = build()
        resumed.load_state_dict(state)
        assert lines(resumed, total - k) == reference[k:], f"resume after {k} lines differs"
        # Saving again at the same point gives the same state (nothing moved on save).
        again = build()
        again.load_state_dict(state)
        assert state_to_bytes(saved(again)) == state_to_bytes(state), f"state at {k} unstable"


def _run_ranks(
    chains: dict[int, Stage],
    emitted: dict[int, int],
    world_size: int,
    n_shards: int,
    batch_size: int,
    steps: int,
) -> list[list[tuple[int, ...]]]:
    """``steps`` global steps: each rank deals its rows over its shards (the loader's rule)."""
    dealers = []
    for rank in range(world_size):
        mine = list(owned_shards(rank, world_size, n_shards))
        dealers.append((mine, RowDealer([emitted[sid] for sid in mine])))
    out = []
    for _ in range(steps):
        step = []
        for mine, dealer in dealers:
            for local in dealer.deal(batch_size):
                sid = mine[local]
                step.append(line_key(next(chains[sid])))
                emitted[sid] += 1
        out.append(sorted(step))
    return out


def check_stage_rescale(
    build_shard: Callable[[int], Stage],
    n_shards: int,
    before: int,
    after: int,
    batch_size: int,
    before_after: tuple[int, int] = (10, 10),
) -> None:
    """Run ``n_shards`` shard chains on ``before`` ranks, save every shard, re-deal the
    shards over ``after`` ranks: the global steps that follow equal the uninterrupted run's
    (both world sizes times ``batch_size`` must be multiples of ``n_shards``)."""
    first, second = before_after
    reference = _run_ranks(
        {s: build_shard(s) for s in range(n_shards)},
        dict.fromkeys(range(n_shards), 0),
        before,
        n_shards,
        batch_size,
        first + second,
    )
    chains = {s: build_shard(s) for s in range(n_shards)}
    emitted = dict.fromkeys(range(n_shards), 0)
    assert _run_ranks(chains, emitted, before, n_shards, batch_size, first) == reference[:first]
    states = {s: saved(chain) for s, chain in chains.items()}
    resumed = {}
    for s, state in states.items():
        resumed[s] = build_shard(s)
        resumed[s].load_state_dict(state)
    # The new world size deals the same rows per global step: batch_size * before rows.
    rows = batch_size * before // after
    got = _run_ranks(resumed, emitted, after, n_shards, rows, second)
    assert got == reference[first:], f"rescale {before} -> {after} ranks differs"
