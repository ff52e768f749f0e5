"""The span pipeline of one logical shard: documents -> mixing -> packing -> shuffle.

A logical shard's lines depend only on (data, config, seed, shard id); this module is the
single place that wires the stages together for a shard.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from fmsdata.config import LoaderConfig
from fmsdata.permute import derive_key
from fmsdata.schedule import WeightSchedule
from fmsdata.stages.documents import Decoration, DocumentStream
from fmsdata.stages.mixing import TokenShareMixer
from fmsdata.stages.packing import LinePacker
from fmsdata.stages.shuffle import ShuffleBuffer

__all__ = ["ShardRecipe", "build_shard", "open_shard"]


@dataclasses.dataclass(frozen=True)
class ShardRecipe:
    """Everything a shard pipeline is built from, taken from the config once."""

    names: tuple[str, ...]
    schedule: WeightSchedule
    seed: int
    n_shards: int
    decoration: Decoration
    capacity: int
    packing: str
    window: int

    @staticmethod
    def from_config(config: LoaderConfig, names: Sequence[str]) -> ShardRecipe:
        return ShardRecipe(
            names=tuple(names),
            schedule=weight_schedule(config, len(names)),
            seed=config.seed,
            n_shards=config.logical_shards,
            decoration=Decoration(
                bos=config.bos_token,
                eos=config.eos_token,
                strip=frozenset(config.strip_tokens),
                min_length=config.min_length,
            ),
            capacity=config.content_capacity,
            packing=config.packing,
            window=config.shuffle_window,
        )


def weight_schedule(config: LoaderConfig, n_datasets: int) -> WeightSchedule:
    """The config's weights as a function of a logical shard's clock."""
    if config.weight_schedule is None:
        return WeightSchedule.constant(config.weights or (1.0,) * n_datasets)
    fraction = 1.0 / config.logical_shards
    if config.schedule_unit == "steps":
        assert config.global_batch_size is not None, "validated by the config"
        fraction *= config.global_batch_size * config.seq_length
    return WeightSchedule.from_points(
        config.weight_schedule,
        fraction,
        linear=config.schedule_interpolation == "linear",
        resolution=config.schedule_resolution,
    )


def open_shard(
    shard: int, recipe: ShardRecipe, accesses: Sequence, state: Any = None, advance: int = 0
) -> ShuffleBuffer:
    """A shard's pipeline at a saved position: ``state`` (None = start) plus ``advance``
    lines emitted after it, which are replayed at span level (no tokens are read).

    The replayed lines stay in the shuffle buffer's journal, so a replica that still holds
    ``state`` learns about them with the shard's next update.
    """
    streams, pipeline = _chain(shard, recipe, accesses)
    if state is not None:
        pipeline.load_state_dict(state)
    for stream in streams:
        stream.prefetch_upcoming()
    for _ in range(advance):
        next(pipeline)
    return pipeline


def build_shard(shard: int, recipe: ShardRecipe, accesses: Sequence) -> ShuffleBuffer:
    """The stage chain of one logical shard, fresh (load a state into it to resume).

    ``accesses`` start with the mixed datasets, in recipe order (more may follow: datasets
    that only buffered lines still read from).
    """
    return _chain(shard, recipe, accesses)[1]


def _chain(
    shard: int, recipe: ShardRecipe, accesses: Sequence
) -> tuple[list[DocumentStream], ShuffleBuffer]:
    streams = [
        DocumentStream(access, shard, recipe.n_shards, recipe.seed, recipe.decoration)
        for access in accesses[: len(recipe.names)]
    ]
    mixer = TokenShareMixer(streams, recipe.names, recipe.schedule)
    packer = LinePacker(mixer, recipe.capacity, recipe.packing)
    return streams, ShuffleBuffer(packer, recipe.window, derive_key(recipe.seed, "shuffle", shard))
