"""Online data mixing (ODM): EXP3 over datasets, rewarded by their training loss.

Albalak et al. 2023, "Efficient Online Data Mixing For Language Model Pre-Training"
(arXiv:2312.02406) treat each dataset as an arm of a multi-armed bandit: the reward of
the arm drawn is its training loss, importance-weighted by the probability it was drawn
with, and smoothed over time; the next probabilities are a softmax of the reward
estimates, mixed with an exploration rate that decays with the number of updates. IBM's
fms-acceleration online-data-mixing plugin applies the same EXP3 update to every arm at
each update, with each arm's last loss as its reward. fmsdata mixes every dataset into
every batch, so at an update every dataset that had tokens in the interval is an arm
drawn with its weight's probability, rewarded with its mean loss per token there:

    R_d <- alpha * R_d + (1 - alpha) * L_d / pi_d         (datasets with tokens only)
    pi  <- (1 - K * eps_{t+1}) * softmax(log w0 + eps_t * R) + eps_{t+1}

with ``eps_t = min(1 / K, sqrt(ln K / (K t)))`` at update ``t`` (the paper's schedule) or
a fixed ``odm_exploration``, and ``w0`` the configured starting weights (uniform, as in the
paper, when none are set).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fmsdata.util.statecheck import fail, need_count, need_keys, need_list

__all__ = ["OnlineDataMixing", "exploration_rate"]


def exploration_rate(t: int, k: int, fixed: float | None) -> float:
    """``eps_t``: ``fixed`` when set, else ``min(1 / K, sqrt(ln K / (K t)))`` (``t >= 1``)."""
    if fixed is not None:
        return fixed
    return min(1.0 / k, math.sqrt(math.log(k) / (k * max(t, 1))))


class OnlineDataMixing:
    """ODM's EXP3 policy (module docstring). State: ``updates`` (t) and ``estimates``
    (the smoothed importance-weighted reward of each dataset).

    Args:
        datasets: Dataset names, in config order.
        weights: Starting weights (any scale).
        smoothing: alpha, the old estimate's share.
        exploration: A fixed eps, or None for the paper's decaying one.
    """

    def __init__(
        self,
        datasets: Sequence[str],
        weights: Sequence[float],
        smoothing: float = 0.9,
        exploration: float | None = None,
    ):
        self.k = len(datasets)
        w0 = np.asarray(weights, dtype=np.float64)
        with np.errstate(divide="ignore"):
            self.log_prior = np.log(w0 / w0.sum())
        self.smoothing = float(smoothing)
        self.exploration = exploration
        self.updates = 0
        self.estimates = np.zeros(self.k)

    def update(self, losses: np.ndarray, tokens: np.ndarray, weights: np.ndarray) -> list[float]:
        """New weights from each dataset's mean loss (``losses``, over ``tokens`` > 0)
        in an interval drawn with ``weights`` (normalized)."""
        drawn = (tokens > 0) & (weights > 0)
        alpha = self.smoothing
        rewards = np.where(drawn, losses / np.where(drawn, weights, 1.0), 0.0)
        smoothed = alpha * self.estimates + (1 - alpha) * rewards
        self.estimates = np.where(drawn, smoothed, self.estimates)
        self.updates += 1
        rate = exploration_rate(self.updates, self.k, self.exploration)
        explore = exploration_rate(self.updates + 1, self.k, self.exploration)
        z = self.log_prior + rate * self.estimates
        z = np.exp(z - z.max())
        return ((1 - self.k * explore) * z / z.sum() + explore).tolist()

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates, "estimates": self.estimates.tolist()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        need_keys(state, "policy", ("updates", "estimates"))
        estimates = need_list(state["estimates"], "policy.estimates", self.k)
        if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in estimates):
            raise fail("policy.estimates", f"expected {self.k} finite numbers, got {estimates!r}")
        self.updates = need_count(state["updates"], "policy.updates")
        self.estimates = np.asarray(estimates, dtype=np.float64)
