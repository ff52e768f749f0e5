"""Global steps at span level: every rank's rows dealt as the loader deals them, and each
logical shard's lines pulled from its own chain, with no token read.

The loader of rank ``r`` of ``W`` owns the logical shards ``owned_shards(r, W, L)`` and
deals each batch's rows to them with ``RowDealer`` (fewest lines emitted first, lowest
index on ties; a pure function of the lines each shard has emitted), whatever its workers
(``fmsdata.worker.dataset``); a row gets the next line of its shard, rows in order.
A skip deals the skipped steps the same way and drops their lines
(``FmsDataLoader.skip``). So a global step's rows are the next lines of the shards its
deal names, and a walk needs only the shards it follows: each is built by the loader's
own stage factory, loaded from the origin's state and replayed at span level
(``fmsdata.worker.chain``).

Where the run's weights changed after the origin (a closed-loop mix,
``Origin.changes``), the walk changes them where the loader did
(``FmsDataLoader._apply_weights``): once every line of the steps up to the change is
pulled, each followed shard's chain state is carried over to the new weights by the
loader's own ``fmsdata.state.remix`` (every share measured afresh) and its chain built
again from there with them, as the loader's ``fmsdata.loader.resume.settle`` does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator

import numpy as np

from fmsdata.loader.dataloader import due_skips
from fmsdata.loader.resume import at_seq_length
from fmsdata.stages.lineblock import LineBlock
from fmsdata.state.format import ShardEntry
from fmsdata.state.remix import remix
from fmsdata.trace.origin import Origin
from fmsdata.trace.rows import LineTracer, RowTrace
from fmsdata.worker.chain import ShardPipeline
from fmsdata.worker.dataset import RankLineDataset, ShardContext
from fmsdata.worker.topology import RowDealer, owned_shards

__all__ = ["StepDeal", "StepWalker", "deal_counts"]

_CHUNK = 4096  # lines pulled at a time when lines are passed over


@dataclasses.dataclass(frozen=True)
class StepDeal:
    """One global step's deal.

    Attributes:
        step: The step (the run's ``loader.steps`` after it).
        shards: Per rank, the logical shard of each row (None: a rank not followed).
        skipped: The skip ``(at, n)`` that passed over this step (its rows were consumed,
            not delivered), or None.
    """

    step: int
    shards: list[list[int] | None]
    skipped: tuple[int, int] | None


class StepWalker:
    """Walks a run's global steps from an origin, following some logical shards.

    Args:
        origin: Where the run starts (``fmsdata.trace.origin``).
        follow: The logical shards whose lines are pulled (default: all); only the
            ranks owning one are dealt.
    """

    def __init__(self, origin: Origin, follow: Collection[int] | None = None):
        self.origin = origin
        n_shards = origin.config.logical_shards
        self.world_size = origin.world_size
        self.follow = set(range(n_shards)) if follow is None else set(follow)
        self.ranks = [
            list(owned_shards(r, self.world_size, n_shards)) for r in range(self.world_size)
        ]
        emitted = list(origin.start.emitted or [0] * n_shards)
        self._dealers = [
            RowDealer([emitted[s] for s in shards]) if self.follow & set(shards) else None
            for shards in self.ranks
        ]
        self.steps = origin.steps
        self._recorded = [list(skip) for skip in origin.skips]
        self._next_line = dict(enumerate(emitted))
        self._pipelines: dict[int, ShardPipeline] = {}
        self._context: ShardContext | None = None
        self._deals = self._deal_steps()
        # The run's chains from the origin on: the origin's, then each weight change's.
        self.dataset: RankLineDataset = origin.dataset
        self._changes = sorted(
            ((step, list(w)) for step, w in origin.changes if step >= self.steps),
            key=lambda change: change[0],
        )

    # -- the deal ----------------------------------------------------------------------

    def next_deal(self) -> StepDeal:
        """The deal of the next global step (its lines not pulled)."""
        return next(self._deals)

    def _deal_steps(self) -> Iterator[StepDeal]:
        """Each global step from the origin on, skipped ones included, in order."""
        while True:
            for n in due_skips(self.origin.skip_steps, self.steps, self._recorded):
                skip = (self.steps, n)
                self._recorded.append([self.steps, n])
                for _ in range(n):
                    self.steps += 1
                    yield StepDeal(self.steps, self._deal(), skip)
            self.steps += 1
            yield StepDeal(self.steps, self._deal(), None)

    def _deal(self) -> list[list[int] | None]:
        batch_size = self.origin.batch_size
        return [
            None if dealer is None else [shards[i] for i in dealer.deal(batch_size)]
            for dealer, shards in zip(self._dealers, self.ranks)
        ]

    # -- the lines ---------------------------------------------------------------------

    def next_line(self, shard: int) -> int:
        """The index in its shard of the next line ``shard`` gives (lines from the run's
        start)."""
        return self._next_line[shard]

    def told(
        self, tracer: LineTracer, spans: np.ndarray, rank: int, row: int, shard: int, line: int
    ) -> RowTrace:
        """The row that ``line`` of ``shard`` (its ``spans``) became at ``rank``'s ``row``,
        through the shard's token stages (their state loaded ``ahead`` lines before it)."""
        state = self.origin.start.states.get(shard)
        ahead = line - (int(state["emitted"]) if state is not None else 0)
        stages = self.pipeline(shard).token_stages
        return tracer.row(spans, stages, ahead, rank, row, shard, line)

    def pipeline(self, shard: int) -> ShardPipeline:
        """The shard's chain, opened at the origin on first use."""
        pipeline = self._pipelines.get(shard)
        if pipeline is None:
            if shard not in self.follow:
                raise ValueError(f"logical shard {shard} is not followed")
            if self.dataset is not self.origin.dataset:
                raise AssertionError("every followed shard is open once the weights change")
            start = self.origin.start
            pipeline = self.context().open(
                shard,
                self.dataset.stages,
                state=start.states.get(shard),
                where=start.paths.get(shard, ""),
            )
            self._pipelines[shard] = pipeline
            self._pass(pipeline, start.advance.get(shard, 0))
        return pipeline

    # -- weight changes ------------------------------------------------------------------

    def change_due(self, through: int) -> bool:
        """Whether the run changed its weights after some step up to ``through``, and the
        walk has not yet."""
        return bool(self._changes) and self._changes[0][0] <= through

    def apply_changes(self, through: int) -> None:
        """Change the weights as the run did after each step up to ``through`` (module
        docstring); every line of those steps must be pulled."""
        while self.change_due(through):
            step, weights = self._changes.pop(0)
            self._change_weights(step, weights)

    def _change_weights(self, step: int, weights: list[float]) -> None:
        old = self.dataset
        shards = sorted(self.follow)
        entries = {s: ShardEntry(s, self.pipeline(s).state_dict()) for s in shards}
        names = list(old.mix_names)
        new = at_seq_length(old, None, datasets=names, weights=list(weights))
        space = [d.name for d in old.catalog().datasets]  # the saved spans' numbering
        recorded = [dict(stage) for stage in old.layout()[0]]
        carried, space = remix(entries, recorded, new.mix_names, space, rebase=True)
        new.drain(space[len(new.mix_names) :])
        self.close()
        self.dataset = new
        context = self.context()
        for s in shards:
            where = f"logical shard {s} carried over to the weights of step {step + 1}"
            self._pipelines[s] = context.open(s, new.stages, state=carried[s].state, where=where)

    def take(self, shard: int, n: int) -> LineBlock:
        """The shard's next ``n`` lines."""
        lines = self.pipeline(shard).take_lines(n)
        self._next_line[shard] += n
        return lines

    def pass_over(self, counts: dict[int, int]) -> None:
        """Pull and drop ``counts[shard]`` lines of each followed shard (the others are
        not pulled)."""
        for shard, n in sorted(counts.items()):
            if n and shard in self.follow:
                self._pass(self.pipeline(shard), n)
                self._next_line[shard] += n

    @staticmethod
    def _pass(pipeline: ShardPipeline, n: int) -> None:
        for done in range(0, n, _CHUNK):
            pipeline.take_lines(min(_CHUNK, n - done))

    def walk_to(self, step: int) -> StepDeal:
        """Pass over every step before ``step`` (their lines pulled and dropped); return
        the deal of ``step`` (its lines not pulled yet).

        Raises:
            ValueError: ``step`` is not after the origin.
        """
        if step <= self.steps:
            raise ValueError(f"step {step} is not after {self.origin.label} (step {self.steps})")
        counts: list[list[int]] = []
        while True:
            deal = self.next_deal()
            if self.change_due(deal.step - 1):
                self.pass_over(_count(counts))
                counts = []
                self.apply_changes(deal.step - 1)
            if deal.step == step:
                self.pass_over(_count(counts))
                return deal
            counts.extend(shards for shards in deal.shards if shards is not None)
            if len(counts) >= _CHUNK:
                self.pass_over(_count(counts))
                counts = []

    def pass_through(self, step: int) -> None:
        """Pass over every step up to ``step``, itself included (nothing when the walk is
        there already), and change the weights where the run changed them after it."""
        if step > self.steps:
            self.pass_over(deal_counts(self.walk_to(step)))
        self.apply_changes(step)

    def state_of(self, shard: int) -> dict:
        """The shard's span-level state here (its token stages left out: the walk does not
        run them), in a form that depends only on what it holds: saved, loaded into a fresh
        chain that measures what it restores, and saved again. (A resumed chain holds
        spans whose document facts it has not measured, and saves their lengths where an
        unbroken one leaves them to the document's end.)"""
        fresh = self.context().open(
            shard, self.dataset.stages, state=self.pipeline(shard).state_dict()
        )
        return {"emitted": fresh.emitted, "stages": fresh.lines.state_dict()}

    # -- set-up ------------------------------------------------------------------------

    def context(self) -> ShardContext:
        if self._context is None:
            self._context = self.dataset.shard_context(len(self.follow))
        return self._context

    def close(self) -> None:
        if self._context is not None:
            self._context.close()
            self._context = None
        self._pipelines.clear()

    def __enter__(self) -> StepWalker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _count(rows: list[list[int]]) -> dict[int, int]:
    """Lines per shard of the rows of some deals."""
    if not rows:
        return {}
    flat = np.concatenate([np.asarray(r, dtype=np.int64) for r in rows])
    counts = np.bincount(flat)
    return {int(s): int(c) for s, c in enumerate(counts) if c}


def deal_counts(deal: StepDeal) -> dict[int, int]:
    """Lines per shard of one step's deal."""
    return _count([shards for shards in deal.shards if shards is not None])


def line_tracer(walker: StepWalker) -> LineTracer:
    """How the walk's rows are told: the config's line layout over the walk's data."""
    config = walker.origin.config
    context = walker.context()
    return LineTracer(
        context.accesses,
        context.recipe.decoration,
        config.line_length,
        config.bol_token,
        config.eol_token,
        config.lines.line_pad_token,
    )
