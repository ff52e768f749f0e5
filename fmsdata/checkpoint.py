"""Saving and loading the loader state next to a model checkpoint.

On disk, a loader checkpoint is a folder with one file per rank, ``loader_rank_00003.fms``,
each a state file (``fmsdata.statefile``: a zip of ``state.json`` and ``.npy`` arrays,
never unpickled) holding that rank's ``snapshot()``: format version, world size, steps,
the fingerprint of data and config (which includes the number of logical shards), and its
logical shards' states. Files are written to a temporary name and renamed, so a crash
mid-save leaves the previous file whole.

Loading reads only the files holding the logical shards this rank now owns, so it works on
any world size. For ``torch.distributed.checkpoint``, the loader is a ``Stateful``; load
with ``LoadPlanner()`` (see ``FmsDataLoader.state_dict``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from fmsdata.errors import StateMismatchError
from fmsdata.state import META_KEY, SHARD_PREFIX
from fmsdata.statefile import load_state, save_state
from fmsdata.topology import owned_shards

__all__ = [
    "save_loader_state",
    "load_loader_state",
    "rank_file",
    "rank_files",
    "latest_checkpoint",
    "LoadPlanner",
    "AutoCheckpointer",
]

logger = logging.getLogger(__name__)

_RANK_FILE = re.compile(r"^loader_rank_(\d{5})\.fms$")
_STEP_DIR = re.compile(r"^step_(\d{9})$")


def rank_file(ckpt_dir: str | os.PathLike[str], rank: int) -> str:
    """Path of a rank's loader state file inside a checkpoint folder."""
    return os.path.join(os.fspath(ckpt_dir), f"loader_rank_{rank:05d}.fms")


def save_loader_state(loader: Any, ckpt_dir: str | os.PathLike[str]) -> str:
    """Write this rank's loader state into ``ckpt_dir`` (created if needed); atomic.

    Returns:
        The file written.
    """
    return _write(loader.snapshot(), ckpt_dir)


def _write(snapshot: dict[str, Any], ckpt_dir: str | os.PathLike[str]) -> str:
    os.makedirs(ckpt_dir, exist_ok=True)
    path = rank_file(ckpt_dir, int(snapshot["rank"]))
    save_state(path, snapshot)
    return path


def rank_files(ckpt_dir: str) -> dict[int, str]:
    """Rank number -> path of the loader state files in a checkpoint folder."""
    try:
        names = os.listdir(ckpt_dir)
    except FileNotFoundError:
        raise StateMismatchError(f"loader checkpoint {ckpt_dir!r} does not exist") from None
    found = {}
    for name in names:
        match = _RANK_FILE.match(name)
        if match:
            found[int(match.group(1))] = os.path.join(ckpt_dir, name)
    return found


def load_loader_state(
    loader: Any, ckpt_dir: str | os.PathLike[str], allow_changes: Sequence[str] = ()
) -> None:
    """Resume ``loader`` from a checkpoint folder written by ``save_loader_state``, on this
    world size or any other.

    Args:
        loader: An ``FmsDataLoader``.
        ckpt_dir: The folder holding ``loader_rank_*.fms``.
        allow_changes: Fingerprint fields allowed to differ (an intended config change).

    Raises:
        StateMismatchError: No files, a rank file missing or unreadable, files from
            different saves, or a state that does not fit this loader. Nothing is written.
    """
    ckpt_dir = os.fspath(ckpt_dir)
    files = rank_files(ckpt_dir)
    if not files:
        raise StateMismatchError(f"{ckpt_dir}: no loader state files (loader_rank_*.fms)")
    first = load_state(files[min(files)])
    saved_world = first.get("world_size") if isinstance(first, dict) else None
    if not isinstance(saved_world, int) or saved_world < 1:
        raise StateMismatchError(f"{files[min(files)]}: no valid world_size in the loader state")
    missing = [rank_file(ckpt_dir, r) for r in range(saved_world) if r not in files]
    if missing:
        raise StateMismatchError(
            f"{ckpt_dir}: saved by {saved_world} ranks but {len(missing)} rank file(s) are "
            f"missing: {', '.join(os.path.basename(m) for m in missing)}"
        )
    extra = sorted(r for r in files if r >= saved_world)
    if extra:
        raise StateMismatchError(
            f"{ckpt_dir}: holds rank files {extra} beyond the saving world size {saved_world}"
        )
    states = [first] if min(files) in _needed(loader, saved_world) else []
    for rank in sorted(_needed(loader, saved_world) - {min(files)}):
        states.append(load_state(files[rank]))
    steps = {int(s["steps"]) for s in states}
    if len(steps) > 1:
        raise StateMismatchError(
            f"{ckpt_dir}: rank files come from different steps {sorted(steps)} "
            "(a save that did not finish on every rank)"
        )
    loader.load_state_dict(states, allow_changes=allow_changes)


def _needed(loader: Any, saved_world: int) -> set[int]:
    """Ranks of the saving run whose logical shards this rank now owns."""
    n_shards = loader.config.logical_shards
    mine = set(loader.dataset.shard_ids)
    return {
        rank for rank in range(saved_world) if mine & set(owned_shards(rank, saved_world, n_shards))
    }


def latest_checkpoint(root: str | os.PathLike[str]) -> str | None:
    """The newest ``step_*`` folder under ``root`` that every saving rank finished, or None.

    A folder is complete when it holds one file per rank of the world size its files
    record; a save interrupted on some rank leaves an incomplete folder, which is skipped.
    """
    root = os.fspath(root)
    if not os.path.isdir(root):
        return None
    steps = sorted((name for name in os.listdir(root) if _STEP_DIR.match(name)), reverse=True)
    for name in steps:
        folder = os.path.join(root, name)
        files = rank_files(folder)
        if not files:
            continue
        try:
            world = load_state(files[min(files)])["world_size"]
        except (StateMismatchError, KeyError, TypeError):
            continue
        if set(files) == set(range(world)):
            return folder
    return None


class LoadPlanner(DefaultLoadPlanner):
    """A DCP load planner that sizes the loader's entries from the checkpoint.

    The loader's state entries are byte tensors whose length depends on the state saved;
    the default planner requires the destination to already have the saved shape. Pass
    ``planner=LoadPlanner()`` to ``torch.distributed.checkpoint.load``; everything else
    loads as with the default planner.
    """

    def set_up_planner(
        self, state_dict: Any, metadata: Any = None, is_coordinator: bool = False
    ) -> None:
        super().set_up_planner(state_dict, metadata, is_coordinator)
        if metadata is None:
            return
        for fqn, value in list(self.state_dict.items()):
            leaf = fqn.rsplit(".", 1)[-1]
            if not (leaf == META_KEY or leaf.startswith(SHARD_PREFIX)):
                continue
            saved = metadata.state_dict_metadata.get(fqn)
            if not isinstance(saved, TensorStorageMetadata) or not isinstance(value, torch.Tensor):
                continue
            resized = torch.empty(saved.size, dtype=torch.uint8)
            self.state_dict[fqn] = resized
            if getattr(self, "flatten_state_dict", False) and fqn in getattr(self, "mappings", {}):
                _set_path(self.original_state_dict, self.mappings[fqn], resized)


def _set_path(root: Any, path: Sequence[Any], value: Any) -> None:
    node = root
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


class AutoCheckpointer:
    """Saves the loader state every ``every`` steps into ``root/step_NNNNNNNNN/``, on a
    background thread so the training loop does not wait on the disk.

    The state is captured on the calling thread (it describes exactly the batches handed
    out so far); serializing and writing happen on the thread. Only the newest ``keep``
    step folders are kept (each rank removes its own files; emptied folders go).
    """

    def __init__(self, root: str, every: int, keep: int = 2):
        self.root = root
        self.every = every
        self.keep = keep
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def after_step(self, loader: Any) -> None:
        steps = loader.steps
        if self.every <= 0 or steps % self.every:
            return
        self.wait()
        snapshot = loader.snapshot()
        folder = os.path.join(self.root, f"step_{steps:09d}")
        self._thread = threading.Thread(target=self._save, args=(snapshot, folder), daemon=True)
        self._thread.start()

    def _save(self, snapshot: dict[str, Any], folder: str) -> None:
        try:
            _write(snapshot, folder)
            self._prune(int(snapshot["rank"]))
        except BaseException as err:  # reported on the training thread by wait()
            self._error = err

    def _prune(self, rank: int) -> None:
        steps = sorted(name for name in os.listdir(self.root) if _STEP_DIR.match(name))
        for name in steps[: -self.keep] if self.keep > 0 else []:
            folder = os.path.join(self.root, name)
            try:
                os.remove(rank_file(folder, rank))
            except FileNotFoundError:
                pass
            if not os.listdir(folder):
                shutil.rmtree(folder, ignore_errors=True)

    def wait(self) -> None:
        """Block until the save in flight is written; re-raise its error, if any."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
