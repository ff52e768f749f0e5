"""Dataset weights over the course of a run (G9): constant, step-wise or linear schedules.

A logical shard knows nothing of global steps; what it knows is its *clock*, the document
tokens it has mixed so far. Each shard produces about ``1 / L`` of the run's tokens, so a
schedule point at ``T`` global tokens (or at step ``S``, i.e. ``S * global_batch_size``
lines of ``content_capacity`` document tokens each) is reached by every shard at clock
``T / L``. Weights change only at fixed clock values (schedule points, or the cells of a
fine grid for linear schedules), so the mix is a pure function of the shard's state and
resumes and rescales exactly.

The mixer follows a schedule through its integral (``ShareTargets``): by clock ``c`` each
dataset should have given the tokens its normalized weight accumulated up to ``c``, so
shares follow the schedule however often the weights change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from fmsdata.errors import ConfigError
from fmsdata.util.compiled import compiled

__all__ = ["WeightSchedule", "ShareTargets"]


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

    def pieces(self) -> tuple[np.ndarray, np.ndarray]:
        """The schedule as constant pieces: ``(bounds, weights)`` with ``bounds`` [P - 1]
        the clocks where the weights change and ``weights`` [P, datasets] the weights
        before the first bound, between bounds, and after the last."""
        first = np.asarray(self.weights[0], dtype=np.float64)
        if len(self.clocks) == 1:
            return np.zeros(0), first[None, :]
        bounds: list[float] = []
        rows = [first]
        for k in range(len(self.clocks) - 1):
            here = np.asarray(self.weights[k], dtype=np.float64)
            after = np.asarray(self.weights[k + 1], dtype=np.float64)
            span = self.clocks[k + 1] - self.clocks[k]
            cells = self.resolution if self.linear else 1
            if k > 0 or not self.linear:
                bounds.append(self.clocks[k])
                rows.append(here)
            for cell in range(1, cells):
                bounds.append(self.clocks[k] + span * cell / cells)
                rows.append(here + (after - here) * (cell / cells))
        bounds.append(self.clocks[-1])
        rows.append(np.asarray(self.weights[-1], dtype=np.float64))
        return np.asarray(bounds), np.stack(rows)

    def targets(self, base: Sequence[int]) -> ShareTargets:
        """Each dataset's target tokens over the clock, from ``base`` tokens at clock
        ``sum(base)`` (where shares are measured from: the start, or a resume that changed
        the mix)."""
        start = float(sum(base))
        bounds, weights = self.pieces()
        first = int(np.searchsorted(bounds, start, side="right"))  # the piece holding start
        starts = np.concatenate([[start], bounds[first:]])
        rows = weights[first:]
        shares = rows / rows.sum(axis=1, keepdims=True)
        reached = np.empty((len(starts) + 1, shares.shape[1]))
        reached[0] = np.asarray(base, dtype=np.float64)
        reached[1:-1] = reached[0] + np.cumsum(shares[:-1] * np.diff(starts)[:, None], axis=0)
        reached[-1] = np.where(shares[-1] > 0, np.inf, reached[-2])
        return ShareTargets(starts, shares, reached)


@dataclasses.dataclass(frozen=True)
class ShareTargets:
    """Each dataset's target token count as a function of the shard's clock: the integral
    of its normalized scheduled weight, piece by piece.

    Attributes:
        starts: [P] clock where each piece begins.
        shares: [P, datasets] normalized weights of each piece.
        reached: [P + 1, datasets] target at each piece's start; the last row is the target
            at the end of time (inf for a dataset whose share stays positive).
    """

    starts: np.ndarray
    shares: np.ndarray
    reached: np.ndarray

    def clock_at(self, d: int, tokens: npt.ArrayLike) -> np.ndarray:
        """For each token count, the first clock at which dataset ``d``'s target exceeds
        it (inf when it never does). One compiled pass (``_clock_at``): the mixer asks
        for every document it reads ahead."""
        if not 0 <= d < self.shares.shape[1]:  # the compiled pass does not check bounds
            raise IndexError(f"dataset {d} of {self.shares.shape[1]}")
        tokens = np.asarray(tokens, dtype=np.float64)
        out = np.empty(tokens.shape)
        _clock_at(tokens.reshape(-1), d, self.starts, self.shares, self.reached, out.reshape(-1))
        return out


@compiled(ieee_division=True)
def _clock_at(tokens, d, starts, shares, reached, out):  # type: ignore[no-untyped-def]
    """``out[i]``: the clock at which dataset ``d``'s target passes ``tokens[i]``. Piece
    ``k`` is the number of targets ``reached[1:, d]`` at most the count (numpy's
    ``searchsorted(side="right")``, by bisection); past the last piece, inf. The clock is
    ``starts[k] + (count - reached[k, d]) / shares[k, d]``: the same float operations, in
    the same order, as that formula in numpy (the mix's tie-breaking depends on them),
    and, as there, a count below a zero share's target gives -inf or nan, not an error."""
    pieces = starts.shape[0]
    for i in range(tokens.shape[0]):
        count = tokens[i]
        low, high = 0, pieces
        while low < high:
            middle = (low + high) >> 1
            if reached[middle + 1, d] <= count:
                low = middle + 1
            else:
                high = middle
        if low < pieces:
            out[i] = starts[low] + (count - reached[low, d]) / shares[low, d]
        else:
            out[i] = np.inf
