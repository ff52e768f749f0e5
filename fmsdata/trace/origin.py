"""Where a traced run starts: the start of the run a config describes, a checkpoint, or the
start of the run that led to a checkpoint.

The position is the loader's own: a one-rank loader over every logical shard
(``fmsdata.loader.build.open_loader``) loads the checkpoint as a resumed run would (its
fingerprint checked, a mix change on resume applied, ``FmsDataLoader.start_position``),
which gives each logical shard's state, the lines consumed past it and the lines
consumed from it. A shard's lines do not depend on the world size (G2), so one loader over
all of them serves every rank; the ranks' rows are dealt by the trace
(``fmsdata.trace.walker``) with the world size the run used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from fmsdata.config import LoaderConfig, as_config
from fmsdata.errors import ConfigError
from fmsdata.loader.build import open_loader
from fmsdata.loader.dataloader import FmsDataLoader
from fmsdata.stages.shard import StageFactory
from fmsdata.state.fingerprint import MIX_FIELDS
from fmsdata.state.format import LoaderState, mix_history_of
from fmsdata.worker.dataset import RankLineDataset, Start
from fmsdata.worker.topology import Topology

__all__ = ["Origin", "run_start", "checkpoint_start", "start_before", "saved_mix"]


@dataclasses.dataclass
class Origin:
    """A run's position the trace walks on from.

    Attributes:
        loader: A one-rank loader over every logical shard, at that position (its
            ``dataset`` gives the data, the recipe and the chain).
        start: Per logical shard its state, the lines consumed past it and the lines
            consumed from it (``emitted``, in shard order).
        steps: Global steps consumed before (skipped ones counted).
        skips: ``[step, n]`` of the skips made before.
        skip_steps: The skips the run makes from here on when its steps come
            (``fmsdata.loader.dataloader.due_skips``).
        world_size: Ranks the rows are dealt over from here on.
        label: How the output names this position.
        changes: The weights a closed-loop mix applied after the origin, ``[(step,
            weights)]``: each from the batch after ``step`` on, the shards' chains carried
            over there as the loader carried them (``fmsdata.trace.walker``).
    """

    loader: FmsDataLoader
    start: Start
    steps: int
    skips: list[list[int]]
    skip_steps: list[list[int]]
    world_size: int
    label: str
    changes: list[tuple[int, list[float]]] = dataclasses.field(default_factory=list)

    @property
    def dataset(self) -> RankLineDataset:
        return self.loader.dataset  # type: ignore[return-value]

    @property
    def config(self) -> LoaderConfig:
        return self.loader.config

    @property
    def batch_size(self) -> int:
        return self.config.batch_size


def _loader(config: LoaderConfig, stages: StageFactory | None) -> FmsDataLoader:
    """A one-rank loader over every logical shard that never iterates (no workers, no
    automatic checkpoints)."""
    quiet = config.replace(num_workers=0, checkpoint_dir=None, checkpoint_every=0)
    return open_loader(quiet, Topology(0, 1), stages=stages)


def _world_size(config: LoaderConfig, world_size: int | None, saved: int | None) -> int:
    """The world size given, else the checkpoint's, else the one ``global_batch_size``
    implies.

    Raises:
        ConfigError: None of them says it, or it does not fit the logical shards.
    """
    world_size = saved if world_size is None else world_size
    global_batch = config.global_batch_size
    if world_size is None and global_batch and global_batch % config.batch_size == 0:
        world_size = global_batch // config.batch_size
    if world_size is None:
        raise ConfigError(
            "the trace needs the run's world size to say which rank got which row: pass "
            "--world-size (world_size=), a checkpoint, or set global_batch_size in the config"
        )
    if not 1 <= world_size <= config.logical_shards:
        raise ConfigError(
            f"world size {world_size} does not fit logical_shards={config.logical_shards} "
            "(every rank needs at least one logical shard)"
        )
    return world_size


def run_start(
    config: LoaderConfig | Any, world_size: int | None = None, stages: StageFactory | None = None
) -> Origin:
    """The start of the run ``config`` describes (its ``skip_steps`` apply)."""
    loader = _loader(as_config(config), stages)
    size = _world_size(loader.config, world_size, None)
    skip_steps = [list(skip) for skip in loader.config.skip_steps]
    return Origin(loader, loader.start_position(), 0, [], skip_steps, size, "the run's start")


def checkpoint_start(
    config: LoaderConfig | Any,
    states: Sequence[Any],
    world_size: int | None = None,
    stages: StageFactory | None = None,
) -> Origin:
    """A checkpoint (every rank's state), loaded into ``config`` as a resumed run loads it
    (a mix change on resume applied as ``allow_mix_change`` allows), continued on
    ``world_size`` ranks (default: the checkpoint's) with ``config``'s ``skip_steps``."""
    loader = _loader(as_config(config), stages)
    saved = LoaderState.read(list(states), loader.config.logical_shards)
    loader.load_state_dict(list(states))
    size = _world_size(loader.config, world_size, saved.world_size)
    skip_steps = [list(skip) for skip in loader.config.skip_steps]
    start, label = loader.start_position(), f"the checkpoint at step {loader.steps}"
    return Origin(loader, start, loader.steps, loader.skips, skip_steps, size, label)


def saved_mix(config: LoaderConfig | Any, states: Sequence[Any]) -> LoaderConfig:
    """``config`` with the mix a checkpoint was saved with (no mix change allowed)."""
    config = as_config(config)
    saved = LoaderState.read(list(states), config.logical_shards)
    mix = {field: saved.fingerprint[field] for field in MIX_FIELDS if field in saved.fingerprint}
    return config.replace(**mix, allow_mix_change=False)


def start_before(
    config: LoaderConfig | Any, states: Sequence[Any], stages: StageFactory | None = None
) -> Origin:
    """The start of the run that led to a checkpoint, as far as the checkpoint says: its
    mix (datasets, weights, schedule), its world size and the skips it records, and where
    its weights followed the loss (or changed on a resume), the weights it started with and
    each change up to the checkpoint (``fmsdata.state.format.mix_history_of``). Whether the
    run really started so (no other mix change on an earlier resume, the same data) is
    checked by replaying it to the checkpoint (``fmsdata.trace.tracer``)."""
    saved = LoaderState.read(list(states), as_config(config).logical_shards)
    mixed = saved_mix(config, states)
    history = [(step, w) for step, w in mix_history_of(saved) if step <= saved.steps]
    if history and history[0][0] <= 0:
        mixed = mixed.replace(weights=list(history[0][1]))
    loader = _loader(mixed, stages)
    skips = [list(skip) for skip in saved.skips]
    size = _world_size(loader.config, None, saved.world_size)
    changes = [(step, list(w)) for step, w in history if step > 0]
    label = "the run's start (as the checkpoint records it)"
    return Origin(loader, loader.start_position(), 0, [], skips, size, label, changes)
