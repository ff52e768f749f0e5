"""Saving and loading the loader state next to a model checkpoint.

On disk, a loader checkpoint is a folder with one file per rank, ``loader_rank_00003.fms``,
each a state file (``fmsdata.statefile``: a zip of ``state.json`` and ``.npy`` arrays,
never unpickled) holding that rank's ``snapshot()``: format version, world size, steps,
the fingerprint of data and config (which includes the number of logical shards), and its
logical shards' states. Files are written to a temporary name and renamed, so a crash
mid-save leaves the previous file whole.

Loading reads only the files holding the logical shards this rank now owns, so it works on
any world size. For ``torch.distributed.checkpoint``, the loader is a ``Stateful``; load
with ``LoadPlanner()`` (see ``FmsDataLoader.state_dict``) and
``storage_reader=SafeFileSystemReader(path)`` (from ``fmsdata.dcpread``), which loads the
whole checkpoint without running anything its files hold.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # handed out by __getattr__ below
    from fmsdata.dcpplan import LoadPlanner
    from fmsdata.dcpread import SafeFileSystemReader

from fmsdata.config import CheckpointConfig
from fmsdata.errors import StateMismatchError
from fmsdata.exits import finish_at_exit, release
from fmsdata.statefile import load_state, peek_state, save_state
from fmsdata.topology import owned_shards

__all__ = [
    "save_loader_state",
    "load_loader_state",
    "rank_file",
    "rank_files",
    "latest_checkpoint",
    "step_folders",
    "LoadPlanner",
    "SafeFileSystemReader",
    "AutoCheckpointer",
]

logger = logging.getLogger(__name__)


def __getattr__(name: str) -> Any:
    """``LoadPlanner`` and ``SafeFileSystemReader``, imported when first asked for: they
    need ``torch.distributed.checkpoint``, whose import costs every process that loads
    fmsdata about 0.6 s (a DataLoader worker started with spawn, a CLI command)."""
    if name == "LoadPlanner":
        from fmsdata.dcpplan import LoadPlanner

        return LoadPlanner
    if name == "SafeFileSystemReader":
        from fmsdata.dcpread import SafeFileSystemReader

        return SafeFileSystemReader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


@dataclasses.dataclass(frozen=True)
class _Save:
    """What one rank file says about the save it belongs to."""

    rank: int
    world_size: int
    steps: int


def _save_of(path: str) -> _Save:
    """The rank, world size and step a rank file records (reads only its JSON part).

    Raises:
        StateMismatchError: Unreadable, or the fields are missing or not counts.
        FileNotFoundError: The file is gone (another rank pruned it).
    """
    header = peek_state(path)
    fields = [header.get(k) if isinstance(header, dict) else None for k in _SAVE_FIELDS]
    if not all(type(v) is int for v in fields) or fields[0] < 0 or fields[1] < 1 or fields[2] < 0:
        found = dict(zip(_SAVE_FIELDS, fields))
        raise StateMismatchError(f"{path}: not a loader state of one rank of a save ({found})")
    return _Save(*fields)


_SAVE_FIELDS = ("rank", "world_size", "steps")


def _complete_save(ckpt_dir: str) -> tuple[dict[int, str], _Save] | None:
    """The rank files of ``ckpt_dir`` and its save when every rank of that save wrote its
    file, else None. Rank 0's file names the world size; every rank below it must have a
    file recording the same world size and step. Files vanishing meanwhile (pruned by
    another rank) make the folder incomplete, never an error."""
    try:
        files = rank_files(ckpt_dir)
        if 0 not in files:
            return None
        first = _save_of(files[0])
        for rank in range(first.world_size):
            if rank not in files or _save_of(files[rank]) != dataclasses.replace(first, rank=rank):
                return None
    except (StateMismatchError, FileNotFoundError):
        return None
    return {rank: files[rank] for rank in range(first.world_size)}, first


def load_loader_state(
    loader: Any, ckpt_dir: str | os.PathLike[str], allow_changes: Sequence[str] = ()
) -> None:
    """Resume ``loader`` from a checkpoint folder written by ``save_loader_state``, on this
    world size or any other.

    The folder must hold one file per rank of the saving run, all from the same step
    (checked from every file, not only the ones this rank reads), so ranks never resume
    from different saves.

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
    saves = {}
    for rank, path in sorted(files.items()):
        try:
            saves[rank] = _save_of(path)
        except FileNotFoundError:
            raise StateMismatchError(f"{path}: removed while the checkpoint was read") from None
        if saves[rank].rank != rank:
            raise StateMismatchError(f"{path}: holds the state of rank {saves[rank].rank}")
    saved_world = saves[min(files)].world_size
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
    worlds = sorted({save.world_size for save in saves.values()})
    steps = sorted({save.steps for save in saves.values()})
    if len(worlds) > 1 or len(steps) > 1:
        detail = ", ".join(f"rank {r}: step {s.steps} of {s.world_size}" for r, s in saves.items())
        raise StateMismatchError(
            f"{ckpt_dir}: rank files come from different steps or world sizes ({detail}); "
            "a save that did not finish on every rank"
        )
    states = [load_state(files[rank]) for rank in sorted(_needed(loader, saved_world))]
    loader.load_state_dict(states, allow_changes=allow_changes)


def _needed(loader: Any, saved_world: int) -> set[int]:
    """Ranks of the saving run whose logical shards this rank now owns."""
    n_shards = loader.config.logical_shards
    mine = set(loader.dataset.shard_ids)
    return {
        rank for rank in range(saved_world) if mine & set(owned_shards(rank, saved_world, n_shards))
    }


def step_folders(root: str | os.PathLike[str]) -> list[str]:
    """Names of the ``step_*`` folders under ``root``, oldest first (none if no root)."""
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(name for name in names if _STEP_DIR.match(name))


def latest_checkpoint(root: str | os.PathLike[str]) -> str | None:
    """The newest ``step_*`` folder under ``root`` that every saving rank finished, or None.

    A folder is complete when it holds one file per rank of the world size its files
    record, all of the same step; a save interrupted on some rank leaves an incomplete
    folder, which is skipped. Folders removed while this looks are skipped too.
    """
    root = os.fspath(root)
    for name in reversed(step_folders(root)):
        folder = os.path.join(root, name)
        if _complete_save(folder) is not None:
            return folder
    return None


class AutoCheckpointer:
    """Saves the loader state every ``every`` steps into ``root/step_NNNNNNNNN/``, on a
    background thread so the training loop does not wait on the disk.

    The state is captured on the calling thread (it describes exactly the batches handed
    out so far); serializing and writing happen on the thread. ``wait()`` (called before
    the next save, by ``FmsDataLoader.close()`` and at interpreter exit) finishes a save in
    flight. Each file is written under a temporary name and renamed, so a save cut short
    never leaves a half file under the final name.

    Only rank 0 removes old folders, and only complete ones beyond the newest ``keep``
    complete saves (``keep`` 0 keeps all), plus incomplete ones older than those (saves
    abandoned by a crash): the newest complete checkpoint is never removed before the next
    one is complete on every rank. A folder is removed by renaming it out of the
    ``step_*`` namespace first, so no reader ever sees it half deleted.
    """

    def __init__(self, root: str, every: int, keep: int = 2):
        self.root = root
        self.every = every
        self.keep = keep
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @classmethod
    def from_config(cls, checkpoint: CheckpointConfig) -> AutoCheckpointer | None:
        """The checkpointer a config's ``checkpoint`` section asks for (None: off)."""
        if not (checkpoint.checkpoint_dir and checkpoint.checkpoint_every):
            return None
        return cls(
            checkpoint.checkpoint_dir, checkpoint.checkpoint_every, checkpoint.checkpoint_keep
        )

    def after_step(self, loader: Any) -> None:
        steps = loader.steps
        if self.every <= 0 or steps % self.every:
            return
        self.wait()
        snapshot = loader.snapshot()
        folder = os.path.join(self.root, f"step_{steps:09d}")
        self._thread = threading.Thread(target=self._save, args=(snapshot, folder), daemon=True)
        # Held until waited for: its loader may be gone by exit, the thread is a daemon.
        finish_at_exit(self.wait, "the loader checkpoint being saved", hold=True)
        self._thread.start()

    def _save(self, snapshot: dict[str, Any], folder: str) -> None:
        try:
            _write(snapshot, folder)
            if int(snapshot["rank"]) == 0:
                self._prune()
        except BaseException as err:  # reported on the training thread by wait()
            self._error = err

    def _prune(self) -> None:
        names = step_folders(self.root)
        complete = [n for n in names if _complete_save(os.path.join(self.root, n)) is not None]
        if not complete or self.keep <= 0:
            return
        oldest_kept = complete[-self.keep :][0]
        for name in names:
            if name < oldest_kept:
                _remove_folder(os.path.join(self.root, name))

    def wait(self) -> None:
        """Block until the save in flight is written; re-raise its error, if any."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        release(self.wait)
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def _remove_folder(folder: str) -> None:
    """Take ``folder`` out of view atomically (rename), then delete it; gone already is fine."""
    parent, name = os.path.split(folder)
    doomed = os.path.join(parent, f".removing-{name}-{os.getpid()}")
    try:
        os.rename(folder, doomed)
    except FileNotFoundError:
        return
    shutil.rmtree(doomed, ignore_errors=True)
