"""Dataset weights over the course of a run (G9): constant, step-wise or linear schedules.

A logical shard knows nothing of global steps; what it knows is its *clock*, the document
tokens it has mixed so far. Each shard produces about ``1 / L`` of the run's tokens, so a
schedule point at ``T`` global tokens (or at step ``S``, i.e. ``S * global_batch_size *
seq_length`` tokens) is reached by every shard at clock ``T / L``. Weights change only at
fixed clock values (schedule points, or the cells of a fine grid for linear schedules), so
the mix is a pure function of the shard's state and resumes and rescales exactly.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from fmsdata.errors import ConfigError

__all__ = ["WeightSchedule"]


@dataclasses.dataclass(frozen=True)
class WeightSchedule:
    """Weights as a function of a shard's clock.

    Attributes:
        clocks: Shard clock of each point, increasing (the first applies before it too).
        weights: Weights of each point, one row per point.
        linear: Interpolate between points (on a grid of ``resolution`` cells per span);
            otherwise each point's weights hold until the next point.
        resolution: Grid cells between consecutive points of a linear schedule.
    """

    clocks: tuple[float, ...]
    weights: tuple[tuple[float, ...], ...]
    linear: bool = False
    resolution: int = 100

    @staticmethod
    def constant(weights: Sequence[float]) -> WeightSchedule:
        return WeightSchedule(clocks=(0.0,), weights=(tuple(float(w) for w in weights),))

    @staticmethod
    def from_points(
        points: Sequence[tuple[float, Sequence[float]]],
        shard_fraction: float,
        linear: bool,
        resolution: int = 100,
    ) -> WeightSchedule:
        """From ``(global position, weights)`` points; ``shard_fraction`` converts global
        positions (tokens) into a shard clock (``1 / logical_shards``)."""
        clocks = tuple(float(at) * shard_fraction for at, _ in points)
        weights = tuple(tuple(float(w) for w in ws) for _, ws in points)
        if any(b <= a for a, b in zip(clocks, clocks[1:])):
            raise ConfigError(
                f"weight schedule points must increase, got {[at for at, _ in points]}"
            )
        return WeightSchedule(clocks, weights, linear, resolution)

    def _cell(self, clock: float) -> tuple[int, int]:
        """(point index, grid cell inside the span after it) holding ``clock``."""
        k = max(bisect.bisect_right(self.clocks, clock) - 1, 0)
        if not self.linear or k + 1 >= len(self.clocks) or clock < self.clocks[0]:
            return k, 0
        span = self.clocks[k + 1] - self.clocks[k]
        return k, min(int((clock - self.clocks[k]) / span * self.resolution), self.resolution - 1)

    def weights_at(self, clock: float) -> np.ndarray:
        """Weights in effect at ``clock``."""
        k, cell = self._cell(clock)
        here = np.asarray(self.weights[k], dtype=np.float64)
        if cell == 0 or not self.linear:
            return here
        after = np.asarray(self.weights[k + 1], dtype=np.float64)
        return here + (after - here) * (cell / self.resolution)

    def next_change(self, clock: float) -> float:
        """The smallest clock above ``clock`` where the weights change (inf if none)."""
        if clock < self.clocks[0]:  # the first point's weights hold before it too
            return self.next_change(self.clocks[0])
        k, cell = self._cell(clock)
        if k + 1 >= len(self.clocks):
            return math.inf
        if not self.linear:
            return self.clocks[k + 1]
        span = self.clocks[k + 1] - self.clocks[k]
        return self.clocks[k] + span * (cell + 1) / self.resolution
