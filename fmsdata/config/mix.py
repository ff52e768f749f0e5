"""The ``mix`` section: which datasets are read and in what token shares over the run.

Its fields are the loader state's mix (``fmsdata.state.fingerprint.MIX_FIELDS``): what a resume
with ``allow_mix_change`` may change.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args

from fmsdata.config.values import set_field, split_csv, to_number, weight_list
from fmsdata.errors import ConfigError

__all__ = ["MixConfig", "ScheduleUnit", "ScheduleInterpolation"]

ScheduleUnit = Literal["tokens", "steps"]
ScheduleInterpolation = Literal["step", "linear"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class MixConfig:
    """The datasets of the root that are read, and their weights (fixed or scheduled).

    Attributes:
        datasets: Dataset folder names; None means every folder of the root except ``meta``.
        weights: Token share of each dataset (non-negative, any scale); None means equal.
        weight_schedule: Weights that change over the run: ``[[at, [w, ...]], ...]`` with
            ``at`` in ``schedule_unit``; replaces ``weights``.
        schedule_unit: ``"tokens"`` (global document tokens) or ``"steps"`` (needs
            ``global_batch_size``; with ``packing="hard"`` a point at step ``S`` takes
            effect in the batch of step ``S``, counted from 0).
        schedule_interpolation: ``"step"`` (each point holds until the next) or
            ``"linear"`` (moves between points in ``schedule_resolution`` steps).
        schedule_resolution: Cells of the grid a ``"linear"`` schedule moves on between two
            points (its weights change at each cell's start).
        global_batch_size: Sequences per global step, for step-based schedules.
    """

    datasets: tuple[str, ...] | None = None
    weights: tuple[float, ...] | None = None
    weight_schedule: tuple[tuple[int, tuple[float, ...]], ...] | None = None
    schedule_unit: ScheduleUnit = "tokens"
    schedule_interpolation: ScheduleInterpolation = "step"
    schedule_resolution: int = 100
    global_batch_size: int | None = None

    def __post_init__(self) -> None:
        datasets = split_csv("datasets", self.datasets)
        if datasets is not None:
            if not datasets or any(not name for name in datasets):
                raise ConfigError(f"datasets must name at least one folder, got {self.datasets!r}")
            if len(set(datasets)) != len(datasets):
                raise ConfigError(f"datasets lists a folder twice: {self.datasets!r}")
        set_field(self, "datasets", datasets)
        weights = split_csv("weights", self.weights)
        if weights is not None:
            set_field(self, "weights", weight_list("weights", weights, datasets))
        if self.schedule_unit not in get_args(ScheduleUnit):
            raise ConfigError(
                f"schedule_unit must be 'tokens' or 'steps', got {self.schedule_unit!r}"
            )
        if self.schedule_interpolation not in get_args(ScheduleInterpolation):
            raise ConfigError(
                "schedule_interpolation must be 'step' or 'linear', "
                f"got {self.schedule_interpolation!r}"
            )
        if self.global_batch_size is not None:
            size = to_number("global_batch_size", self.global_batch_size, int)
            if size < 1:
                raise ConfigError(
                    f"global_batch_size must be positive, got {self.global_batch_size!r}"
                )
            set_field(self, "global_batch_size", size)
        resolution = to_number("schedule_resolution", self.schedule_resolution, int)
        if resolution < 1:
            raise ConfigError(
                f"schedule_resolution must be positive, got {self.schedule_resolution!r}"
            )
        set_field(self, "schedule_resolution", resolution)
        if self.weight_schedule is not None:
            set_field(self, "weight_schedule", self._schedule_points(datasets))

    def _schedule_points(
        self, datasets: tuple[str, ...] | None
    ) -> tuple[tuple[int, tuple[float, ...]], ...]:
        schedule: Any = self.weight_schedule
        if self.weights is not None:
            raise ConfigError("set weights or weight_schedule, not both")
        if not isinstance(schedule, (list, tuple)) or not schedule:
            raise ConfigError(f"weight_schedule must be a list of [at, weights], got {schedule!r}")
        points = []
        for point in schedule:
            if not isinstance(point, (list, tuple)) or len(point) != 2:
                raise ConfigError(f"weight_schedule points are [at, weights], got {point!r}")
            at = to_number("weight_schedule", point[0], int)
            if at < 0:
                raise ConfigError(
                    f"weight_schedule position must be non-negative, got {point[0]!r}"
                )
            weights = split_csv("weight_schedule", point[1]) or ()
            points.append((at, weight_list("weight_schedule", weights, datasets)))
        if any(b[0] <= a[0] for a, b in zip(points, points[1:])):
            raise ConfigError(
                f"weight_schedule positions must increase, got {[p[0] for p in points]}"
            )
        if self.schedule_unit == "steps" and self.global_batch_size is None:
            raise ConfigError(
                "schedule_unit='steps' needs global_batch_size (sequences per global step)"
            )
        return tuple(points)
