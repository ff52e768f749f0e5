"""A mix that follows the training loss: losses in, weights out, recorded for resume.

The trainer reports each batch's loss (``FmsDataLoader.record_loss``); it is attributed
to the datasets of the batch's tokens (``attribute``), summed over the update interval
and, under ``torch.distributed``, over every rank in rank order (``all_ranks``: every rank
holds the same sums, bit for bit), and every ``mix_update_every`` recorded steps the
policy (``fmsdata.stages.mixpolicy``) turns the means into the next weights. The loader
applies them from its next batch on every rank (``FmsDataLoader._apply_weights``); the
weights as applied, the policy's state and the sums are the state's ``mix_feedback``
(``fmsdata.state.mixrecord``), so the data is a function of (config, seed, the losses).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fmsdata.config import MixConfig, as_plain
from fmsdata.errors import ConfigError
from fmsdata.stages.mixpolicy import MixPolicy, checked_state, checked_weights, make_policy
from fmsdata.stages.outputs import IGNORE_INDEX
from fmsdata.state.mixrecord import MixRecord

__all__ = [
    "MixFeedback",
    "attribute",
    "all_ranks",
    "check_loss",
    "counted_tokens",
    "mix_setup",
    "normalized",
    "resumed",
]


def normalized(weights: Sequence[float]) -> list[float]:
    total = math.fsum(weights)
    return [float(w) / total for w in weights]


def mix_setup(mix: MixConfig, names: Sequence[str]) -> dict[str, Any]:
    """The mix section a feedback record runs with (flat names, plain; ``datasets`` as
    resolved): a resume continues the policy only under the same one."""
    setup = as_plain({f: getattr(mix, f) for f in mix.__dataclass_fields__})
    setup["datasets"] = list(names)
    return setup


def attribute(
    datasets: np.ndarray, loss: np.ndarray, mask: np.ndarray | None, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each dataset's summed loss and its count in one batch.

    Args:
        datasets: [B, S] dataset of each input token (-1: padding).
        loss: [B, S] loss per input token, or [B] per sequence.
        mask: [B, S] tokens whose loss counts (labels not ignored), or None (all but
            padding).
        k: Datasets in the mix (a token of a dataset no longer mixed is not counted).

    Returns:
        ``(loss, count)`` per dataset: per token, the loss summed over its tokens and
        their number; per sequence, each row's loss split by its datasets' token shares,
        and the shares summed (sequences).
    """
    which = np.where((datasets >= 0) & (datasets < k), datasets, k)
    if mask is not None:
        which = np.where(mask, which, k)
    if loss.ndim == 2:
        sums = np.bincount(which.ravel(), weights=loss.ravel(), minlength=k + 1)
        counts = np.bincount(which.ravel(), minlength=k + 1).astype(np.float64)
        return sums[:k], counts[:k]
    rows = len(which)
    per_row = np.bincount(
        (which + np.arange(rows)[:, None] * (k + 1)).ravel(), minlength=rows * (k + 1)
    ).reshape(rows, k + 1)[:, :k]
    tokens = per_row.sum(axis=1, keepdims=True)
    share = np.divide(per_row, tokens, out=np.zeros(per_row.shape), where=tokens > 0)
    return (share * loss[:, None]).sum(axis=0), share.sum(axis=0)


def all_ranks(values: np.ndarray) -> np.ndarray:
    """``values`` summed over every rank in rank order (the same float operations on
    every rank, whatever order the backend would reduce in); as given without
    ``torch.distributed``."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    local = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64)).to(device)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    total = gathered[0].cpu().numpy().copy()
    for part in gathered[1:]:
        total += part.cpu().numpy()
    return total


class MixFeedback:
    """The running feedback mix of a loader: its policy and its record.

    Args:
        mix: The mix section (``mix_policy`` set).
        names: The datasets mixed.
        record: Where a loaded state left it, or None to start at ``step`` with the
            config's weights.
        step: The loader's step (where a fresh history starts).
        history: Entries of an earlier run to keep before this one's (a fresh start).
    """

    def __init__(
        self,
        mix: MixConfig,
        names: Sequence[str],
        record: MixRecord | None = None,
        step: int = 0,
        history: Sequence[tuple[int, list[float]]] = (),
    ):
        assert mix.mix_policy is not None
        self.name = mix.mix_policy
        self.k = len(names)
        start = normalized(mix.weights or [1.0] * self.k)
        self.policy: MixPolicy = make_policy(mix, names, start)
        if record is None:
            record = MixRecord(
                self.name,
                mix_setup(mix, names),
                [*history, (step, start)],
                checked_state(self.name, self.policy.state_dict()),
                [0.0] * self.k,
                [0.0] * self.k,
                0,
            )
        else:
            self.policy.load_state_dict(record.state)
        self.record = record
        self._loss = np.asarray(record.loss, dtype=np.float64)
        self._tokens = np.asarray(record.tokens, dtype=np.float64)

    @property
    def weights(self) -> list[float]:
        """The weights applied now."""
        return list(self.record.history[-1][1])

    def add(self, loss: np.ndarray, tokens: np.ndarray) -> list[float] | None:
        """Add one step's sums (every rank's); the new weights when this step ends an
        interval, else None."""
        both = all_ranks(np.concatenate([loss, tokens]))
        self._loss += both[: self.k]
        self._tokens += both[self.k :]
        record = self.record
        record.records += 1
        if record.records < record.setup["mix_update_every"]:
            self._sync()
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            means = np.where(self._tokens > 0, self._loss / self._tokens, np.nan)
        drawn = np.asarray(self.weights, dtype=np.float64)
        out = self.policy.update(means, self._tokens.copy(), drawn)
        weights = checked_weights(self.name, out, self.k)
        record.state = checked_state(self.name, self.policy.state_dict())
        self._loss[:] = 0
        self._tokens[:] = 0
        record.records = 0
        self._sync()
        return weights

    def applied(self, step: int, weights: list[float]) -> None:
        """``weights`` apply from ``step`` on."""
        history = self.record.history
        if history and history[-1][0] == step:
            history[-1] = (step, weights)
        else:
            history.append((step, weights))

    def _sync(self) -> None:
        self.record.loss = self._loss.tolist()
        self.record.tokens = self._tokens.tolist()


def check_loss(loss: Any, batch_size: int, seq_length: int) -> np.ndarray:
    """The reported loss as float64 numpy, [B, S] or [B].

    Raises:
        ConfigError: Another shape, or a value that is not finite.
    """
    if isinstance(loss, torch.Tensor):
        array = loss.detach().to("cpu", torch.float64).numpy()
    else:
        array = np.asarray(loss, dtype=np.float64)
    if array.shape not in ((batch_size, seq_length), (batch_size,)):
        raise ConfigError(
            f"record_loss needs the loss per input token [{batch_size}, {seq_length}] or per "
            f"sequence [{batch_size}], got shape {list(array.shape)}"
        )
    if not np.isfinite(array).all():
        raise ConfigError("record_loss got a loss that is not finite (nan or inf)")
    return array


def counted_tokens(batch: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    """Where the batch's ``labels`` (a dict's, or a tuple's second tensor) are not
    ignored: the tokens whose loss counts; None when it has no labels of ``shape``."""
    labels = None
    if isinstance(batch, dict):
        labels = batch.get("labels")
    elif isinstance(batch, (tuple, list)) and len(batch) > 1:
        labels = batch[1]
    if not isinstance(labels, torch.Tensor) or tuple(labels.shape) != tuple(shape):
        return None
    return (labels != IGNORE_INDEX).cpu().numpy()


def resumed(
    record: MixRecord | None, mix: MixConfig, names: Sequence[str], steps: int
) -> tuple[MixFeedback | None, MixRecord | None]:
    """What a loader configured with ``mix`` keeps of a loaded state's ``record`` (saved
    at ``steps``): ``(its feedback mix, the history kept without one)``.

    The same mix section (policy, its parameters, datasets, starting weights) continues
    the record: its weights, policy state and sums. Another one starts afresh at
    ``steps`` with the config's weights, after the recorded history (the mix changed:
    the fingerprint check asks for ``allow_mix_change``). Without ``mix_policy`` the
    recorded history is kept, with the config's weights from ``steps`` on when they differ.
    """
    old = list(record.history) if record is not None else []
    if mix.mix_policy is None:
        if record is None:
            return None, None
        kept = MixRecord(None, mix_setup(mix, names), old)
        start = normalized(mix.weights or [1.0] * len(names))
        if old[-1][1] != start:
            kept.history.append((steps, start))
        return None, kept
    if record is not None and record.setup == mix_setup(mix, names):
        return MixFeedback(mix, names, record=record), None
    return MixFeedback(mix, names, step=steps, history=old), None
