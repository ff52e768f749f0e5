"""The ``shards`` section: how the data is split into independent streams, and their key."""

from __future__ import annotations

import dataclasses

from fmsdata.config.section import Section, checked
from fmsdata.config.values import non_negative_int, positive_int

__all__ = ["ShardsConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardsConfig(Section):
    """The logical shards and the seed: every order (file walk, document walk, shuffle,
    fill-in-the-middle draws) is a pure function of (seed, logical shard), which is what
    makes a run resumable and rescalable. A loader state must agree with both.

    Attributes:
        logical_shards: Number of independent streams the data is split into; every world
            size the run may use must be at most this (and divide it for exact rescaling).
            The default, 8 like ``batch_size``, keeps global steps exact on 1 to 8 ranks;
            for more, set a multiple of every world size you will use.
        seed: Seed of every random order (file walk, document walk, shuffle).
    """

    # As batch_size: a global batch of any world size that can run (up to 8 ranks) is then
    # a multiple of it, so the defaults keep G2/G3 exact; more ranks need more shards.
    logical_shards: int = checked(8, positive_int)
    seed: int = checked(42, non_negative_int)
