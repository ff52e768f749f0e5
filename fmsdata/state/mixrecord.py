"""The saved part of a mix that follows the training loss (``mix_policy``): the weights
as applied, the policy's state and the loss summed over the current update interval.

Every rank holds the same record (losses are summed over all ranks as they are
reported), so it sits with the fields every rank shares (the packed state's meta entry)
and a resume on any world size finds it whole. The layout, under the loader state's
``mix_feedback`` (``fmsdata.state.format``, version 6 on)::

    {"policy": mix_policy,
     "setup": the mix section it ran with (flat names; "datasets" as resolved),
     "history": [[step, [weight, ...]], ...]  (normalized, from that step on),
     "state": the policy's state_dict() (plain JSON data),
     "loss": [sum per dataset], "tokens": [tokens per dataset]  (this interval),
     "records": steps recorded in this interval}
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from fmsdata.util.statecheck import fail, join, need_count, need_keys, need_list, need_mapping

__all__ = ["MixRecord", "MIX_RECORD_KEYS"]

MIX_RECORD_KEYS = ("policy", "setup", "history", "state", "loss", "tokens", "records")


@dataclasses.dataclass
class MixRecord:
    """The feedback mix's saved part (module docstring).

    Attributes:
        policy: The ``mix_policy`` it ran with (None: a record kept by a run that has
            none now, for its history).
        setup: The mix section it ran with (decides whether a resume continues the policy).
        history: ``(step, weights)`` as applied, oldest first.
        state: The policy's state (plain data; None without a policy).
        loss: Loss summed per dataset over the current interval, all ranks.
        tokens: Tokens (or sequence shares) behind those sums.
        records: Steps recorded in the current interval.
    """

    policy: str | None
    setup: dict[str, Any]
    history: list[tuple[int, list[float]]]
    state: Any = None
    loss: list[float] = dataclasses.field(default_factory=list)
    tokens: list[float] = dataclasses.field(default_factory=list)
    records: int = 0

    def to_plain(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "setup": self.setup,
            "history": [[step, list(weights)] for step, weights in self.history],
            "state": self.state,
            "loss": list(self.loss),
            "tokens": list(self.tokens),
            "records": self.records,
        }

    @classmethod
    def from_plain(cls, value: Any, path: str) -> MixRecord:
        """Read ``to_plain``'s form strictly.

        Raises:
            StateMismatchError: A field missing, of another type or out of range (named by
                its path under ``path``).
        """
        need_keys(value, path, MIX_RECORD_KEYS)
        policy = value["policy"]
        if policy is not None and not isinstance(policy, str):
            raise fail(join(path, "policy"), f"expected a policy name, got {policy!r}")
        history = []
        for i, point in enumerate(need_list(value["history"], join(path, "history"))):
            where = join(path, f"history[{i}]")
            step, weights = need_list(point, where, 2)
            history.append((need_count(step, where + "[0]"), _numbers(weights, where + "[1]")))
        if any(b[0] < a[0] for a, b in zip(history, history[1:])):
            raise fail(join(path, "history"), "steps must not decrease")
        loss = _numbers(value["loss"], join(path, "loss"))
        tokens = _numbers(value["tokens"], join(path, "tokens"))
        if len(loss) != len(tokens):
            raise fail(join(path, "tokens"), f"expected {len(loss)} numbers, got {len(tokens)}")
        return cls(
            policy,
            dict(need_mapping(value["setup"], join(path, "setup"))),
            history,
            value["state"],
            loss,
            tokens,
            need_count(value["records"], join(path, "records")),
        )


def _numbers(value: Any, path: str) -> list[float]:
    """A list of finite numbers."""
    items = need_list(value, path)
    if not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in items
    ):
        raise fail(path, f"expected finite numbers, got {list(items)!r}")
    return [float(x) for x in items]
