"""Feedback policies: what turns each dataset's reported training loss into new weights.

A policy is a small deterministic object with its own plain-data state (the
``MixPolicy`` protocol): the loader (``fmsdata.loader.feedback``) sums the loss the
trainer reports per dataset over ``mix_update_every`` steps, across ranks, and asks the
policy for the weights of the next interval. ``mix_policy`` names a built-in one
(``"odm"``: ``fmsdata.stages.odm``; ``"doremi"``: ``fmsdata.stages.doremi``) or a user's
class as ``"module:Class"``, made as ``Class(datasets=..., weights=...,
**mix_policy_options)``. Its state is saved in the loader state as plain data (JSON: no
pickling) and loaded back into a policy made the same way.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from fmsdata.config import MixConfig
from fmsdata.errors import ConfigError
from fmsdata.stages.doremi import DoReMi
from fmsdata.stages.odm import OnlineDataMixing

__all__ = ["MixPolicy", "make_policy", "checked_weights", "checked_state"]


@runtime_checkable
class MixPolicy(Protocol):
    """What a feedback policy is. Made as ``Class(datasets=names, weights=start,
    **options)``; deterministic: the same calls give the same weights and state.
    """

    def update(self, losses: np.ndarray, tokens: np.ndarray, weights: np.ndarray) -> Any:
        """The next interval's weights (non-negative, finite, one positive, one per
        dataset, any scale), from the last interval's.

        Args:
            losses: [K] float64, each dataset's mean loss (per token when the trainer
                reports per-token loss, per sequence share otherwise); nan where the
                dataset had no tokens.
            tokens: [K] float64, the tokens (or sequence shares) behind each mean.
            weights: [K] float64, the normalized weights the interval was drawn with.
        """
        ...

    def state_dict(self) -> dict[str, Any]:
        """The policy's state as JSON-able plain data (saved with the loader's)."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a ``state_dict()`` (of a policy made the same way)."""
        ...


def make_policy(mix: MixConfig, names: Sequence[str], weights: Sequence[float]) -> MixPolicy:
    """The policy ``mix.mix_policy`` names, for datasets ``names`` starting at ``weights``.

    Raises:
        ConfigError: A reference loss list of another length, a class that cannot be
            imported or made, or is not a ``MixPolicy`` (naming ``mix_policy``).
    """
    policy = mix.mix_policy
    if policy == "odm":
        return OnlineDataMixing(names, weights, mix.odm_smoothing, mix.odm_exploration)
    if policy == "doremi":
        reference = mix.doremi_reference_losses or ()
        if len(reference) != len(names):
            raise ConfigError(
                f"doremi_reference_losses has {len(reference)} entries but the mix has "
                f"{len(names)} datasets: {list(reference)!r} for {list(names)!r}"
            )
        return DoReMi(names, weights, reference, mix.doremi_step_size, mix.doremi_smoothing)
    if policy is None:
        raise ConfigError("no mix_policy is set")
    module, _, name = policy.partition(":")
    try:
        cls: Any = importlib.import_module(module)
        for part in name.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"mix_policy={policy!r} cannot be imported: {err}") from None
    try:
        made = cls(datasets=list(names), weights=list(weights), **(mix.mix_policy_options or {}))
    except TypeError as err:
        raise ConfigError(f"mix_policy={policy!r} cannot be made: {err}") from None
    if not isinstance(made, MixPolicy):
        raise ConfigError(
            f"mix_policy={policy!r} is not a MixPolicy: it needs update(losses, tokens, "
            "weights), state_dict() and load_state_dict(state)"
        )
    return made


def checked_weights(policy: str, weights: Any, k: int) -> list[float]:
    """A policy's output as ``k`` normalized weights.

    Raises:
        ConfigError: Not ``k`` non-negative finite numbers with one positive (naming the
            policy and the value).
    """
    try:
        values = [float(w) for w in weights]
    except (TypeError, ValueError):
        values = []
    if len(values) != k or not all(math.isfinite(w) and w >= 0 for w in values):
        raise ConfigError(
            f"mix_policy={policy!r} returned {weights!r}: expected {k} non-negative finite weights"
        )
    total = math.fsum(values)
    if total <= 0:
        raise ConfigError(f"mix_policy={policy!r} returned {weights!r}: no positive weight")
    return [w / total for w in values]


def checked_state(policy: str, state: Any) -> Any:
    """A policy's ``state_dict()`` as JSON gives it back (what the saved state holds).

    Raises:
        ConfigError: The state is not JSON-able plain data (naming the policy).
    """
    try:
        return json.loads(json.dumps(state, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"mix_policy={policy!r}: state_dict() must be plain JSON data (finite numbers, "
            f"strings, lists, dicts with string keys): {err}"
        ) from None
