"""Verify, before the run that costs money, that a pipeline resumes and rescales exactly:
what ``fmsdata verify`` runs.

The user's config (a small slice of the data is enough) and stage factory run through the
public API only, as a training job would run them: ``build_dataloader`` for each rank of a
world size (explicit ``rank``/``world_size``, the asked ``num_workers``), batches taken
rank by rank, ``state_dict()`` saved (through the encoding a checkpoint file gives it) and
``load_state_dict()`` into fresh loaders. A *global step* is every rank's batch of a step,
in rank order. Checked against one unbroken run of ``steps`` global steps (the first world
size and worker count):

- a second unbroken run (the pipeline is a function of its config and seed);
- a run that saves its state at every step (saving changes nothing), whose states also
  show where an epoch of some dataset in some logical shard ends;
- resumes in fresh loaders from the start, the middle and both sides of that epoch
  boundary, with each worker count;
- unbroken runs with the other worker counts;
- on each other world size (the same global batch, dealt over more or fewer ranks) an
  unbroken run and rescales from the middle and the epoch boundary: each global step
  must hold the same sequences (G2, G3: as a set, the order of rows among ranks may
  differ), which needs a global batch that is a multiple of ``logical_shards``.

A same-world-size run must give the very same batches, every field. The report is either
"exact" with what was covered, or the first global step that differs, the rank, and the
stage whose state did not carry it (``fmsdata.verify.blame``: each logical shard's chain is
rebuilt with the user's factory and asked stage by stage).
"""

from __future__ import annotations

import dataclasses
import io
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from fmsdata.config import LoaderConfig, as_config
from fmsdata.errors import ConfigError
from fmsdata.loader import build_dataloader
from fmsdata.stages.base import Stage
from fmsdata.stages.shard import Shard, StageFactory, default_stages
from fmsdata.state.report import shard_report
from fmsdata.verify.blame import Blame, blame_shard
from fmsdata.worker.materialize import LineWriter
from fmsdata.worker.topology import owned_shards

__all__ = ["Difference", "VerifyReport", "verify"]

logger = logging.getLogger(__name__)

Batch = dict[str, torch.Tensor]
Step = list[Batch]  # every rank's batch of one global step, in rank order
_BLAME_SHARDS = 8  # logical shards whose chains are asked, the differing rank's first


@dataclasses.dataclass(frozen=True)
class Difference:
    """The first disagreement found.

    Attributes:
        check: The run that disagreed with the unbroken one, in words.
        step: The first global step (0-based) that differs.
        world_size: The checked run's world size.
        rank: The rank whose batch differs first (of ``world_size``).
        what: What differs (a field, or rows missing from the step).
        blame: The stage found responsible, or None when every stage passed.
    """

    check: str
    step: int
    world_size: int
    rank: int
    what: str
    blame: Blame | None = None


@dataclasses.dataclass
class VerifyReport:
    """What ``verify`` found: ``exact`` and what was covered, or the difference."""

    steps: int
    covered: list[str]
    epoch_step: int | None
    difference: Difference | None = None
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def exact(self) -> bool:
        return self.difference is None

    def text(self) -> str:
        lines = []
        if self.difference is None:
            lines.append(f"exact: {len(self.covered)} run(s) of {self.steps} global steps agree")
        else:
            d = self.difference
            lines.append(
                f"NOT exact: {d.check} differs from the unbroken run at global step {d.step}, "
                f"rank {d.rank} ({d.what})"
            )
            lines.append(
                "  stage: " + d.blame.describe()
                if d.blame is not None
                else "  stage: none of the chain's stages fails alone (a stage that depends "
                "on the rank, the worker or the process, or the loader itself)"
            )
        if self.epoch_step is not None:
            lines.append(
                f"epoch boundary: an epoch of a dataset ends in a logical shard within the "
                f"first {self.epoch_step} global step(s); resumes on both sides of it"
            )
        lines.extend(f"note: {note}" for note in self.notes)
        lines.extend(f"  ok: {check}" for check in self.covered)
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        d = self.difference
        return {
            "exact": self.exact,
            "steps": self.steps,
            "covered": list(self.covered),
            "epoch_step": self.epoch_step,
            "notes": list(self.notes),
            "difference": None
            if d is None
            else {
                "check": d.check,
                "step": d.step,
                "world_size": d.world_size,
                "rank": d.rank,
                "what": d.what,
                "stage": None if d.blame is None else d.blame.stage,
                "stage_path": None if d.blame is None else list(d.blame.path),
                "logical_shard": None if d.blame is None else d.blame.shard,
                "why": None if d.blame is None else d.blame.why,
            },
        }


class _Recording:
    """A stage factory that builds with the user's (or the default) and keeps the ``Shard``
    each chain is built from, for the blame (a module-level class: picklable)."""

    def __init__(self, factory: StageFactory | None):
        self.factory = factory
        self.shards: dict[int, Shard] = {}

    def __call__(self, shard: Shard) -> Stage:
        self.shards[shard.id] = shard
        return (self.factory or default_stages)(shard)


def _run(
    config: LoaderConfig,
    factory: StageFactory | None,
    world_size: int,
    steps: int,
    states: Any = None,
    save: Callable[[int, list[Any]], None] | None = None,
) -> list[Step]:
    """``steps`` global steps of every rank's loader of ``world_size``, loaded from ``states``
    when given; ``save(k, loaders)`` after each step's batches when given (and before the
    first)."""
    loaders = [
        build_dataloader(config, rank=r, world_size=world_size, stages=factory)
        for r in range(world_size)
    ]
    for loader in loaders:
        if states is not None:
            loader.load_state_dict(_copy(states))
    iterators = [iter(loader) for loader in loaders]
    out: list[Step] = []
    try:
        for k in range(steps):
            if save is not None:
                save(k, loaders)
            out.append([_batch(next(it)) for it in iterators])
        if save is not None:
            save(steps, loaders)
    finally:
        del iterators
    return out


class _Differs(Exception):
    """The first difference found: no further run is checked."""


def verify(
    config: LoaderConfig | dict[str, Any] | str,
    stages: StageFactory | None = None,
    steps: int = 40,
    world_sizes: Sequence[int] = (1, 2),
    workers: Sequence[int] = (0, 2),
    progress: Callable[[str], None] | None = None,
) -> VerifyReport:
    """Run ``config`` (with the stage factory ``stages``) unbroken and saved, resumed and
    rescaled, and compare every global step (module docstring).

    Args:
        config: The loader config (a small slice of the data is enough).
        stages: The stage factory a training job passes to ``build_dataloader``.
        steps: Global steps of every run; choose them so that an epoch of some dataset
            in some logical shard ends within them (the report says whether one did).
        world_sizes: The first is the reference (``config.batch_size`` is its per-rank
            batch); the others deal the same global batch over more or fewer ranks.
        workers: DataLoader worker counts; the first is the reference's.
        progress: Told each run as it starts.

    Raises:
        ConfigError: A world size that cannot hold the global batch or the logical shards.
    """
    config = as_config(config).replace(checkpoint_dir=None, checkpoint_every=0)
    if steps < 2:
        raise ConfigError(f"verify needs at least 2 steps, got {steps}")
    if not world_sizes or not workers:
        raise ConfigError("verify needs at least one world size and one worker count")
    size0, workers0 = world_sizes[0], workers[0]
    global_batch = size0 * config.batch_size
    for w in world_sizes:
        if w < 1 or global_batch % w or w > config.logical_shards:
            raise ConfigError(
                f"world size {w} cannot run the global batch of {size0} x {config.batch_size} "
                f"= {global_batch} rows over {config.logical_shards} logical shards: each "
                "world size must divide the global batch and be at most logical_shards"
            )
    tell = progress or (lambda what: None)
    report = VerifyReport(steps=steps, covered=[], epoch_step=None)
    saved: dict[int, list[Any]] = {}
    epochs: dict[int, int] = {}

    def keep(k: int, loaders: list[Any]) -> None:
        saved[k] = [_copy(loader.state_dict()) for loader in loaders]
        epochs[k] = max(_epochs(loader) for loader in loaders)

    def run(world: int, n_workers: int, at: int | None = None, **kw: Any) -> list[Step]:
        """The run on ``world`` ranks, resumed from the state saved at step ``at`` (None:
        unbroken, all ``steps``)."""
        per_rank = config.replace(batch_size=global_batch // world, num_workers=n_workers)
        states = None if at is None else saved[at]
        return _run(per_rank, stages, world, steps - (at or 0), states, **kw)

    def check(what: str, world: int, got: list[Step], at: int = 0, as_sets: bool = False) -> None:
        found = _first_difference(got, reference[at:], as_sets)
        if found is not None:
            step, rank, detail = found
            raise _Differs(Difference(what, at + step, world, rank, detail))
        report.covered.append(what)

    def describe(world: int, n_workers: int) -> str:
        return f"{world} rank(s) x {n_workers} worker(s)"

    tell(f"unbroken run, {describe(size0, workers0)}")
    reference = run(size0, workers0)
    try:
        tell("a second unbroken run")
        what = f"a second unbroken run ({describe(size0, workers0)})"
        check(what, size0, run(size0, workers0))
        tell("a run saving its state at every step")
        what = f"a run saving its state at every step ({describe(size0, workers0)})"
        check(what, size0, run(size0, workers0, save=keep))
        crossed = [k for k in sorted(epochs) if epochs[k] > epochs[0]]
        report.epoch_step = crossed[0] if crossed else None
        if report.epoch_step is None:
            report.notes.append(
                f"no epoch of any dataset ended within {steps} steps: resumes across an "
                "epoch boundary were not covered (more --steps, or a smaller slice)"
            )
        middle = steps // 2
        for k in sorted({0, middle} | _around(report.epoch_step, steps)):
            for n in workers if k == middle else workers[:1]:
                what = f"resumed at step {k}, {describe(size0, n)}"
                tell(what)
                check(what, size0, run(size0, n, k), k)
        for n in workers[1:]:
            what = f"unbroken run, {describe(size0, n)}"
            tell(what)
            check(what, size0, run(size0, n))
        if len(world_sizes) > 1 and global_batch % config.logical_shards:
            report.notes.append(
                f"other world sizes not compared: the global batch ({global_batch}) is not a "
                f"multiple of logical_shards ({config.logical_shards}), so a global step's "
                "sequences depend on the world size"
            )
            return report
        for world in world_sizes[1:]:
            what = f"unbroken run, {describe(world, workers0)}"
            tell(what)
            check(what, world, run(world, workers0), as_sets=True)
            for k in sorted({steps // 2} | _around(report.epoch_step, steps) - {0}):
                what = f"rescaled from {size0} to {world} rank(s) at step {k}"
                tell(what)
                check(what, world, run(world, workers0, k), k, as_sets=True)
    except _Differs as differs:
        tell("naming the stage")
        found: Difference = differs.args[0]
        report.difference = dataclasses.replace(
            found, blame=_blame(config, stages, global_batch, found)
        )
    return report


def _around(epoch_step: int | None, steps: int) -> set[int]:
    """The resume points on both sides of an epoch boundary (inside the run)."""
    if epoch_step is None:
        return set()
    return {k for k in (epoch_step - 1, epoch_step) if 0 <= k < steps}


def _blame(
    config: LoaderConfig, stages: StageFactory | None, global_batch: int, diff: Difference
) -> Blame | None:
    """Ask each logical shard's chain (the differing rank's shards first) which stage fails
    (``fmsdata.verify.blame``); None when none does."""
    recording = _Recording(stages)
    single = config.replace(batch_size=global_batch, num_workers=0)
    loader = build_dataloader(single, rank=0, world_size=1, stages=recording)
    n_shards = config.logical_shards
    iterator = iter(loader)
    for _ in range(-(-n_shards // global_batch) + 1):  # every shard builds its chain
        next(iterator)
    del iterator
    resolved = loader.config
    first = list(owned_shards(diff.rank, diff.world_size, n_shards))
    order = first + [s for s in range(n_shards) if s not in first]
    lines_per_step = max(1, global_batch // n_shards)
    lines = sorted({3, 11, min(diff.step * lines_per_step, 4 * 64)})
    for sid in order[:_BLAME_SHARDS]:
        shard = recording.shards.get(sid)
        if shard is None:
            continue
        writer = LineWriter.for_config(shard.accesses, shard.recipe.decoration, resolved)
        found = blame_shard(shard, stages, writer, lines)
        if found is not None:
            return found
    return None


def _epochs(loader: Any) -> int:
    """The most epochs any dataset completed in any logical shard of a rank's loader."""
    state = loader.snapshot(settle=True)
    most = 0
    for entry in state["shards"]:
        report = shard_report(entry["state"], state["fingerprint"], state["span_datasets"])
        most = max([most, *(int(d.get("epoch", 0)) for d in report.datasets.values())])
    return most


def _batch(batch: Any) -> Batch:
    """A batch as a dict of tensors of its own (a tuple batch keyed by position)."""
    if isinstance(batch, dict):
        return {k: v.clone() for k, v in batch.items()}
    return {f"[{i}]": v.clone() for i, v in enumerate(batch)}


def _copy(state: Any) -> Any:
    """A state as a checkpoint file gives it back (tensors only, nothing pickled)."""
    data = io.BytesIO()
    torch.save(state, data)
    data.seek(0)
    return torch.load(data, weights_only=True)


def _first_difference(
    got: list[Step], want: list[Step], as_sets: bool
) -> tuple[int, int, str] | None:
    """``(step, rank, what)`` of the first global step that differs: every field of every
    batch compared, or with ``as_sets`` the step's rows as a multiset."""
    for s, (a, b) in enumerate(zip(got, want)):
        found = _set_difference(a, b) if as_sets else _batch_difference(a, b)
        if found is not None:
            return (s, *found)
    if len(got) != len(want):
        return min(len(got), len(want)), 0, "the run ended early"
    return None


def _batch_difference(a: Step, b: Step) -> tuple[int, str] | None:
    for r, (x, y) in enumerate(zip(a, b)):
        if x.keys() != y.keys():
            return r, f"fields {sorted(x)} instead of {sorted(y)}"
        for key in y:
            if x[key].shape != y[key].shape or not torch.equal(x[key], y[key]):
                return r, f"{key!r} differs"
    return None


def _rows(step: Step) -> Iterator[tuple[int, tuple[Any, ...]]]:
    """``(rank, row)`` of every row of a global step, all its fields side by side."""
    for rank, batch in enumerate(step):
        n = len(next(iter(batch.values())))  # rows: the first field's (input_ids)
        keys = sorted(k for k, v in batch.items() if v.dim() >= 1 and len(v) == n)
        for i in range(n):
            yield rank, tuple(tuple(batch[k][i].reshape(-1).tolist()) for k in keys)


def _set_difference(a: Step, b: Step) -> tuple[int, str] | None:
    theirs = sorted(row for _, row in _rows(b))
    if sorted(row for _, row in _rows(a)) == theirs:
        return None
    wanted = set(theirs)
    rank = next((r for r, row in _rows(a) if row not in wanted), 0)
    return rank, "rows that the unbroken run's step does not hold"
