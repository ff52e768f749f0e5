"""fms-fsdp's loader checkpoints: where its rules find them, and reading them safely.

Layout (``CheckpointDataset``): ``<path>/checkpoints/step_<N>_ckp/loader_state_<p>.pth``,
one file per physical worker ``p`` (rank times DataLoader workers), written by whoever
produces batches when batch ``N+1`` starts (each worker counts only its own batches). At
start fms-fsdp takes the newest ``step_<N>_ckp`` (by ``N``) under ``ckpt_save_path`` (a
restarted job, step count kept), else under ``ckpt_load_path`` if ``resuming_dataset``
(step count restarted at 0). Physical worker ``p`` of ``P`` reads files
``floor(F*p/P) .. ceil(F*(p+1)/P) - 1`` of the ``F`` there; when ``F != P`` it keeps only
the buffers and per-logical-shard states, re-dealt over the new workers.

Files are read with ``torch.load(weights_only=True)`` (fms-fsdp's states hold only
lists, numbers, strings and uint8 tensors), so a crafted file is refused before anything
in it runs. Where fms-fsdp would crash (an entry of ``checkpoints/`` not named
``step_<N>_ckp``) or silently start the data over (the newest step folder holds only
model files), this warns, saying what fms-fsdp would have done, and uses the newest step
folder that holds loader states.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import re
from typing import Any

import numpy as np
import torch

from fmsdata.errors import StateMismatchError

__all__ = ["find_step_folder", "from_fms", "load_fms_file", "reshard", "shard_files"]

logger = logging.getLogger(__name__)

_STEP = re.compile(r"^step_(\d+)_ckp$")


def _loader_files(folder: str, suffix: str) -> list[str]:
    return [x for x in os.listdir(folder) if "loader" in x and x.endswith(suffix)]


def find_step_folder(root: str, suffix: str = ".pth") -> tuple[str, int] | None:
    """The newest ``step_<N>_ckp`` under ``root`` holding loader files, or None."""
    if not os.path.isdir(root):
        return None
    steps = []
    for name in os.listdir(root):
        match = _STEP.match(name)
        if match is None:
            logger.warning(
                "%s: entry %r is not a step_<N>_ckp folder; fms-fsdp would crash on it "
                "(int() of its name), it is ignored here",
                root,
                name,
            )
            continue
        steps.append((int(match.group(1)), os.path.join(root, name)))
    for rank, (step, path) in enumerate(sorted(steps, reverse=True)):
        if os.path.isdir(path) and _loader_files(path, suffix):
            if rank > 0:
                logger.warning(
                    "%s: the newest step folder %s holds no loader states; fms-fsdp would "
                    "start the data from scratch, this continues from %s",
                    root,
                    sorted(steps)[-1][1],
                    path,
                )
            return path, step
    return None


def shard_files(folder: str, suffix: str, p: int, world: int) -> tuple[list[str], int]:
    """The loader files physical worker ``p`` of ``world`` reads, and how many there are."""
    names = _loader_files(folder, suffix)
    try:
        names.sort(key=lambda x: int(x.split("_")[2][: -len(suffix)]))
    except (IndexError, ValueError):
        raise StateMismatchError(
            f"{folder}: loader files must be named loader_state_<rank>{suffix}, got {names}"
        ) from None
    n = len(names)
    mine = names[math.floor(n * p / world) : math.ceil(n * (p + 1) / world)]
    return [os.path.join(folder, x) for x in mine], n


def load_fms_file(path: str) -> dict[str, Any]:
    """One ``loader_state_<p>.pth`` as plain data (tensors to numpy), never running code
    from it.

    Raises:
        StateMismatchError: The file is not a torch file of plain data, or lacks a key.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, AttributeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise StateMismatchError(
            f"{path}: not an fms-fsdp loader state of plain data; refused without running "
            f"it ({first})"
        ) from None
    if not isinstance(state, dict):
        raise StateMismatchError(f"{path}: expected a dict, got {type(state).__name__}")
    return _plain(state)


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.numpy().copy()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


_KEYS = set(
    """SamplingDataset.sample_iterator_states SamplingDataset.tokens_seen
    SamplingDataset.current_iterator BufferDataset.buffer PreloadBufferDataset.g_state
    PreloadBufferDataset.buffer""".split()
)


def from_fms(state: dict[str, Any], path: str) -> dict[str, Any]:
    """fms-fsdp's flat ``Class.field`` keys as the nested state of ``fms_order`` stages."""
    missing = sorted(_KEYS - set(state))
    if missing:
        raise StateMismatchError(f"{path}: not a mamba-new loader state, missing keys {missing}")
    try:
        mixes = [
            {
                "current_reader": sub["ScalableShardDataset.current_reader"],
                "g_state": sub["ScalableShardDataset.g_state"],
                "n_docs_remaining": sub["ScalableShardDataset.n_docs_remaining"],
                "logical_shard_states": [
                    {k.split(".", 1)[1]: v for k, v in shard.items()}
                    for shard in sub["ScalableShardDataset.logical_shard_states"]
                ],
            }
            for sub in state["SamplingDataset.sample_iterator_states"]
        ]
    except (KeyError, TypeError, AttributeError) as err:
        raise StateMismatchError(f"{path}: malformed sample_iterator_states ({err!r})") from None
    return {
        "preload": {
            "g_state": state["PreloadBufferDataset.g_state"],
            "buffer": state["PreloadBufferDataset.buffer"],
        },
        "packer": {"buffer": np.asarray(state["BufferDataset.buffer"], np.int64)},
        "fim": {"g_state": state.get("FIMDataset.g_state")},  # mamba-fim's only
        "mix": {
            "tokens_seen": state["SamplingDataset.tokens_seen"],
            "current_iterator": state["SamplingDataset.current_iterator"],
            "sample_iterator_states": mixes,
        },
    }


def reshard(lists: list[list[Any]], n_files: int, p: int, world: int, what: str) -> list[Any]:
    """fms-fsdp's ``_reshard``: the items of ``lists`` (the files ``p`` read, each list
    as long as the others) that physical worker ``p`` of ``world`` owns."""
    shard_offset = math.floor(n_files * p / world)
    shard_len = len(lists[0])
    if any(len(x) != shard_len for x in lists):
        raise StateMismatchError(
            f"{what}: lists of lengths {[len(x) for x in lists]} cannot be re-dealt "
            "(fms-fsdp asserts they are equal)"
        )
    offset = shard_len * shard_offset
    n_items = n_files * shard_len
    lo, hi = int(n_items * p / world) - offset, int(n_items * (p + 1) / world) - offset
    return [lists[i // shard_len][i % shard_len] for i in range(lo, hi)]
