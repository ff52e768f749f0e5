"""DoReMi's domain weights, online: multiplicative weights from excess loss.

Xie et al. 2023, "DoReMi: Optimizing Data Mixtures Speeds Up Language Model Pretraining"
(arXiv:2305.10429), Algorithm 1: each update, a domain's excess loss over a reference
model's, clipped at zero, raises its weight by exponentiated gradient ascent, and the
weights are smoothed towards uniform:

    lambda_d = max(L_d - ref_d, 0)                    (0 for a domain without tokens)
    a'       = a * exp(eta * lambda)
    a        = (1 - c) * a' / sum(a') + c / K

fmsdata takes ``L_d`` as the mean training loss per token of dataset ``d`` over the
interval and ``ref_d`` from the config (``doremi_reference_losses``: a reference model's
mean loss per token on that dataset), and applies ``a`` as the next weights.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fmsdata.util.statecheck import fail, need_count, need_keys, need_list

__all__ = ["DoReMi"]


class DoReMi:
    """DoReMi's update (module docstring). State: ``updates`` and ``weights`` (``a``).

    Args:
        datasets: Dataset names, in config order.
        weights: Starting weights (any scale).
        reference_losses: Reference loss per dataset.
        step_size: eta.
        smoothing: c.
    """

    def __init__(
        self,
        datasets: Sequence[str],
        weights: Sequence[float],
        reference_losses: Sequence[float],
        step_size: float = 1.0,
        smoothing: float = 1e-3,
    ):
        self.k = len(datasets)
        w0 = np.asarray(weights, dtype=np.float64)
        self.weights = w0 / w0.sum()
        self.reference = np.asarray(reference_losses, dtype=np.float64)
        self.step_size = float(step_size)
        self.smoothing = float(smoothing)
        self.updates = 0

    def update(self, losses: np.ndarray, tokens: np.ndarray, weights: np.ndarray) -> list[float]:
        """New weights from each dataset's mean loss over the interval (``weights``, what
        it was drawn with, is the policy's own ``a`` and not needed)."""
        excess = np.where(tokens > 0, np.maximum(np.nan_to_num(losses) - self.reference, 0), 0)
        with np.errstate(divide="ignore"):
            z = np.log(self.weights) + self.step_size * excess
        z = np.exp(z - z.max())
        c = self.smoothing
        self.weights = (1 - c) * z / z.sum() + c / self.k
        self.updates += 1
        return self.weights.tolist()

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates, "weights": self.weights.tolist()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        need_keys(state, "policy", ("updates", "weights"))
        weights = need_list(state["weights"], "policy.weights", self.k)
        if not all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in weights):
            raise fail("policy.weights", f"expected {self.k} non-negative numbers, got {weights!r}")
        self.updates = need_count(state["updates"], "policy.updates")
        self.weights = np.asarray(weights, dtype=np.float64)
