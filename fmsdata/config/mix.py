"""The ``mix`` section: which datasets are read and in what token shares over the run.

Its fields are the loader state's mix (``fmsdata.state.fingerprint.MIX_FIELDS``): what a resume
with ``allow_mix_change`` may change.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args

from fmsdata.config.section import Section, checked
from fmsdata.config.values import number, one_of, reader, set_field, split_csv, weight_list
from fmsdata.errors import ConfigError

__all__ = ["MixConfig", "ScheduleUnit", "ScheduleInterpolation", "BUILT_IN_POLICIES"]

# The feedback policies fmsdata ships (``fmsdata.stages.mixpolicy``); any other value of
# ``mix_policy`` names a user's class as ``"module:Class"``.
BUILT_IN_POLICIES = ("odm", "doremi")

ScheduleUnit = Literal["tokens", "steps"]
ScheduleInterpolation = Literal["step", "linear"]
_UNITS = get_args(ScheduleUnit)
_POSITION = number(int, "non-negative", lambda at: at >= 0)


def _positive(value: float) -> bool:
    return value > 0


def _is_policy(value: Any) -> bool:
    """A built-in policy's name or ``module.path:Class`` (dotted identifiers on both sides
    of one colon)."""
    module, colon, name = str(value).partition(":")
    dotted = all(part.isidentifier() for part in (*module.split("."), *name.split(".")))
    return isinstance(value, str) and (value in BUILT_IN_POLICIES or (bool(colon) and dotted))


@dataclasses.dataclass(frozen=True, kw_only=True)
class MixConfig(Section):
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
        mix_policy: Weights that follow the training loss the trainer reports
            (``FmsDataLoader.record_loss``; docs/guide/mixing-feedback.md): None (fixed
            weights or a schedule), ``"odm"`` (online data mixing, EXP3 over datasets),
            ``"doremi"`` (multiplicative weights from excess loss over reference losses)
            or ``"module:Class"`` (a user's policy, ``fmsdata.stages.mixpolicy.MixPolicy``).
            ``weights`` are the starting weights; not with ``weight_schedule``.
        mix_update_every: Recorded steps between two weight updates.
        odm_smoothing: ODM's smoothing of each dataset's reward estimate (alpha in
            Albalak et al. 2023): the old estimate's share, in ``[0, 1)``.
        odm_exploration: ODM's exploration rate (epsilon: every dataset keeps at least this
            share), at most ``1 / datasets``; None decays it as the paper does,
            ``min(1 / K, sqrt(ln K / (K t)))`` at update ``t``.
        doremi_reference_losses: DoReMi's reference loss per dataset (mean loss per token
            of a reference model), one per dataset; required by ``"doremi"``.
        doremi_step_size: DoReMi's step size (eta) of the multiplicative update.
        doremi_smoothing: DoReMi's mix with the uniform distribution (c), in ``[0, 1]``.
        mix_policy_options: Keyword arguments of a user policy (plain data).
    """

    datasets: tuple[str, ...] | None = None
    weights: tuple[float, ...] | None = None
    weight_schedule: tuple[tuple[int, tuple[float, ...]], ...] | None = None
    schedule_unit: ScheduleUnit = checked("tokens", one_of(_UNITS, "'tokens' or 'steps'"))
    schedule_interpolation: ScheduleInterpolation = checked(
        "step", one_of(get_args(ScheduleInterpolation), "'step' or 'linear'")
    )
    schedule_resolution: int = checked(100, number(int, "positive", _positive))
    global_batch_size: int | None = checked(None, number(int, "positive", _positive, optional=True))
    mix_policy: str | None = checked(
        None, reader("None, 'odm', 'doremi' or 'module:Class'", _is_policy, optional=True)
    )
    mix_update_every: int = checked(100, number(int, "positive", _positive))
    odm_smoothing: float = checked(0.9, number(float, "in [0, 1)", lambda a: 0 <= a < 1))
    odm_exploration: float | None = None
    doremi_reference_losses: tuple[float, ...] | None = None
    doremi_step_size: float = checked(
        1.0, number(float, "positive and finite", lambda s: 0 < s < float("inf"))
    )
    doremi_smoothing: float = checked(1e-3, number(float, "in [0, 1]", lambda c: 0 <= c <= 1))
    mix_policy_options: dict[str, Any] | None = None

    def _check(self) -> None:
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
        if self.weight_schedule is not None:
            set_field(self, "weight_schedule", self._schedule_points(datasets))
        self._check_feedback(datasets)

    def _check_feedback(self, datasets: tuple[str, ...] | None) -> None:
        """The feedback fields: the policy named well, its parameters in range."""
        policy = self.mix_policy
        if policy is not None and self.weight_schedule is not None:
            raise ConfigError(
                f"mix_policy={policy!r} sets the weights as the run goes: set weights "
                "(where it starts) or weight_schedule, not both"
            )
        if self.odm_exploration is not None:
            n = len(datasets) if datasets is not None else 1
            explore = number(
                float, f"in (0, 1 / datasets] = (0, {1 / n:g}]", lambda e: 0 < e <= 1 / n
            )
            set_field(self, "odm_exploration", explore("odm_exploration", self.odm_exploration))
        losses = split_csv("doremi_reference_losses", self.doremi_reference_losses)
        if losses is not None:
            numbers = weight_list("doremi_reference_losses", losses, datasets, weights=False)
            set_field(self, "doremi_reference_losses", numbers)
        elif policy == "doremi":
            raise ConfigError(
                "mix_policy='doremi' needs doremi_reference_losses (a reference model's mean "
                "loss per token on each dataset), got None"
            )
        options = self.mix_policy_options
        if options is not None:
            if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
                raise ConfigError(
                    "mix_policy_options must be a mapping of names to plain values, "
                    f"got {options!r}"
                )
            if policy is None or policy in BUILT_IN_POLICIES:
                raise ConfigError(
                    f"mix_policy_options={options!r} are a user policy's ('module:Class'), "
                    f"but mix_policy={policy!r}"
                )

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
            at = _POSITION("weight_schedule position", point[0])
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
