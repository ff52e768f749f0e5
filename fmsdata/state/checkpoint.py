"""Saving and loading the loader state next to a model checkpoint, on local disk or in
object storage.

A loader checkpoint is a folder, a local path or any fsspec URL
(``s3://bucket/run1/step10``), with one state file per rank of the saving run and a
marker per rank that says its file is written (``fmsdata.state.checkpointsave`` documents the
layout and when a save counts as complete: the marker of every rank of one save). A
save cut short, on local disk or in an object store, leaves the previous complete save
whole and is never read.

Loading reads only the files holding the logical shards this rank now owns, so it works on
any world size. The storage options, credentials and retries of a URL are the data
root's (``LoaderConfig``'s ``endpoint_url``, ``aws_profile``, ``storage_options``,
``remote_retries``, ...), unless a ``Storage`` is given. For
``torch.distributed.checkpoint``, the loader is a ``Stateful``; load with
``LoadPlanner()`` (see ``FmsDataLoader.state_dict``) and
``storage_reader=SafeFileSystemReader(path)`` (from ``fmsdata.state.dcp_read``, local folders),
which loads the whole checkpoint without running anything its files hold.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import threading
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # handed out by __getattr__ below
    from fmsdata.state.dcp_plan import LoadPlanner
    from fmsdata.state.dcp_read import SafeFileSystemReader

from fmsdata.config import CheckpointConfig
from fmsdata.errors import CheckpointWarning
from fmsdata.remote.folder import Folder
from fmsdata.remote.storage import Storage
from fmsdata.state.checkpointsave import (
    complete_save,
    one_save,
    rank_name,
    read_rank,
    remove_save,
    state_names,
    write_save,
)
from fmsdata.util.exits import finish_at_exit, release
from fmsdata.util.urls import location
from fmsdata.worker.topology import owned_shards

__all__ = [
    "save_loader_state",
    "load_loader_state",
    "rank_file",
    "rank_files",
    "latest_checkpoint",
    "read_checkpoint",
    "step_folders",
    "LoadPlanner",
    "SafeFileSystemReader",
    "AutoCheckpointer",
    "resume_from_folder",
]

logger = logging.getLogger(__name__)


def __getattr__(name: str) -> Any:
    """``LoadPlanner`` and ``SafeFileSystemReader``, imported when first asked for: they
    need ``torch.distributed.checkpoint``, whose import costs every process that loads
    fmsdata about 0.6 s (a DataLoader worker started with spawn, a CLI command)."""
    module = {"LoadPlanner": "dcp_plan", "SafeFileSystemReader": "dcp_read"}.get(name)
    if module is not None:
        return getattr(importlib.import_module(f"fmsdata.state.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_STEP_DIR = re.compile(r"^step_(\d{9})$")


def _folder(
    path: str | os.PathLike[str], storage: Storage | None, what: str, write: bool = False
) -> Folder:
    """The checkpoint folder at ``path``, a URL only of a protocol fmsdata can use there."""
    return Folder(location(path, what, write=write), storage)


def _storage_of(loader: Any) -> Storage:
    """The data root's storage options: checkpoints reach object storage the same way."""
    config = getattr(loader, "config", None)
    return Storage.from_config(config.remote) if config is not None else Storage()


def rank_file(ckpt_dir: str | os.PathLike[str], rank: int) -> str:
    """Path (or URL) of a rank's loader state file inside a checkpoint folder."""
    return Folder(ckpt_dir).join(rank_name(rank))


def save_loader_state(
    loader: Any, ckpt_dir: str | os.PathLike[str], *, storage: Storage | None = None
) -> str:
    """Write this rank's loader state into ``ckpt_dir`` (a local folder, created if
    needed, or a URL such as ``s3://bucket/run1/step10``); all or nothing.

    Args:
        loader: An ``FmsDataLoader``.
        ckpt_dir: The checkpoint folder; every rank of the job saves into the same one.
        storage: How to reach a URL (default: the loader config's storage options).

    Returns:
        The state file written.

    Raises:
        ConfigError: ``ckpt_dir`` is a URL fmsdata cannot write (unknown protocol).
        RemoteIOError: The store refused the write, or it failed through every retry.
    """
    folder = _folder(ckpt_dir, storage or _storage_of(loader), "save_loader_state(ckpt_dir)", True)
    return write_save(loader.snapshot(), folder)


def rank_files(
    ckpt_dir: str | os.PathLike[str], *, storage: Storage | None = None
) -> dict[int, str]:
    """Rank number -> path (or URL) of the loader state files in a checkpoint folder
    (none when it is empty or absent)."""
    folder = _folder(ckpt_dir, storage, "rank_files(ckpt_dir)")
    return {rank: folder.join(name) for rank, name in state_names(folder.names()).items()}


def load_loader_state(
    loader: Any,
    ckpt_dir: str | os.PathLike[str],
    allow_changes: Sequence[str] = (),
    *,
    storage: Storage | None = None,
) -> None:
    """Resume ``loader`` from a checkpoint folder written by ``save_loader_state``, on this
    world size or any other.

    The folder must hold one complete save: every rank of the saving run with its file,
    all of the same step, so ranks never resume from different saves.

    Args:
        loader: An ``FmsDataLoader``.
        ckpt_dir: The folder (or URL) holding ``loader_rank_*.fms``.
        allow_changes: Fingerprint fields allowed to differ (an intended config change),
            e.g. ``["seq_length"]`` to continue at another sequence length
            (docs/guide/resume.md); added to the config's ``allow_changes``.
        storage: How to reach a URL (default: the loader config's storage options).

    Raises:
        StateMismatchError: No files, a rank file missing or unreadable, files from
            different saves, or a state that does not fit this loader. Nothing is written.
    """
    folder = _folder(ckpt_dir, storage or _storage_of(loader), "load_loader_state(ckpt_dir)")
    save, files = one_save(folder)
    states = [
        read_rank(folder, files, save.of(rank)) for rank in sorted(_needed(loader, save.world_size))
    ]
    loader.load_state_dict(states, allow_changes=allow_changes)


def read_checkpoint(
    ckpt_dir: str | os.PathLike[str], *, storage: Storage | None = None
) -> list[dict[str, Any]]:
    """Every rank's state of the save in a checkpoint folder, in rank order, checked as
    ``load_loader_state`` checks it (for tools that show a save: ``fmsdata state show``).

    Raises:
        StateMismatchError: As ``load_loader_state``.
    """
    folder = _folder(ckpt_dir, storage, "read_checkpoint(ckpt_dir)")
    save, files = one_save(folder)
    return [read_rank(folder, files, save.of(rank)) for rank in range(save.world_size)]


def _needed(loader: Any, saved_world: int) -> set[int]:
    """Ranks of the saving run whose logical shards this rank now owns."""
    n_shards = loader.config.logical_shards
    mine = set(loader.dataset.shard_ids)
    return {
        rank for rank in range(saved_world) if mine & set(owned_shards(rank, saved_world, n_shards))
    }


def step_folders(root: str | os.PathLike[str], *, storage: Storage | None = None) -> list[str]:
    """Names of the ``step_*`` folders under ``root``, oldest first (none if no root)."""
    return _step_names(_folder(root, storage, "step_folders(root)"))


def _step_names(root: Folder) -> list[str]:
    return [name for name in root.names() if _STEP_DIR.match(name)]


def latest_checkpoint(
    root: str | os.PathLike[str], *, storage: Storage | None = None
) -> str | None:
    """The newest ``step_*`` folder under ``root`` (a local folder or a URL) whose save is
    complete, or None.

    A save interrupted on some rank leaves an incomplete folder, which is skipped; so are
    folders removed while this looks.

    Args:
        root: The folder of automatic checkpoints (``checkpoint_dir``).
        storage: How to reach a URL (default: the AWS environment, 8 tries).
    """
    folder = _folder(root, storage, "latest_checkpoint(root)")
    for name in reversed(_step_names(folder)):
        step = folder.sub(name)
        if complete_save(step) is not None:
            return step.location
    return None


class AutoCheckpointer:
    """Saves the loader state every ``every`` steps into ``root/step_NNNNNNNNN/`` (``root``
    a local folder or a URL), on a background thread so the training loop does not wait
    on the disk or the network.

    The state is captured on the calling thread (it describes exactly the batches handed
    out so far); serializing and writing happen on the thread. ``wait()`` (called before
    the next save, by ``FmsDataLoader.close()`` and at interpreter exit) finishes a save in
    flight. A save cut short leaves its folder incomplete (``fmsdata.state.checkpointsave``);
    one whose folder was removed while it was written warns (``CheckpointWarning``) and
    the run goes on.

    Only rank 0 removes old folders, and only complete ones beyond the newest ``keep``
    complete saves (``keep`` 0 keeps all), plus incomplete ones older than those (saves
    abandoned by a crash): the newest complete checkpoint is never removed before the next
    one is complete on every rank, and a folder being deleted is incomplete to every
    reader (``checkpointsave.remove_save``).
    """

    def __init__(self, root: str, every: int, keep: int = 2, storage: Storage | None = None):
        self.root = root
        self.every = every
        self.keep = keep
        self.folder = _folder(root, storage, "checkpoint_dir", write=True)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._lost: str | None = None  # a save whose folder was removed meanwhile

    @classmethod
    def from_config(
        cls, checkpoint: CheckpointConfig, storage: Storage | None = None
    ) -> AutoCheckpointer | None:
        """The checkpointer a config's ``checkpoint`` section asks for (None: off), reaching
        its folder with ``storage`` (the data root's)."""
        if not (checkpoint.checkpoint_dir and checkpoint.checkpoint_every):
            return None
        return cls(
            checkpoint.checkpoint_dir,
            checkpoint.checkpoint_every,
            checkpoint.checkpoint_keep,
            storage,
        )

    def after_step(self, loader: Any) -> None:
        steps = loader.steps
        if self.every <= 0 or steps % self.every:
            return
        self.wait()
        snapshot = loader.snapshot()
        folder = self.folder.sub(f"step_{steps:09d}")
        self._thread = threading.Thread(target=self._save, args=(snapshot, folder), daemon=True)
        # Held until waited for: its loader may be gone by exit, the thread is a daemon.
        finish_at_exit(self.wait, "the loader checkpoint being saved", hold=True)
        self._thread.start()

    def _save(self, snapshot: dict[str, Any], folder: Folder) -> None:
        try:
            write_save(snapshot, folder)
            if int(snapshot["rank"]) == 0:
                self._prune()
        except FileNotFoundError as err:
            # Its folder (or the checkpoint root) was removed while it was written: this
            # save is lost, not the run; the previous complete save and the next are whole.
            self._lost = (
                f"the loader checkpoint {folder.location} was removed while it was saved "
                f"(step {snapshot['steps']}, rank {snapshot['rank']}): this save is "
                f"incomplete and is never read; the run goes on and saves again at the "
                f"next multiple of checkpoint_every={self.every} ({err})"
            )
        except BaseException as err:  # reported on the training thread by wait()
            self._error = err

    def _prune(self) -> None:
        if self.keep <= 0:
            return
        names = _step_names(self.folder)
        complete = [n for n in names if complete_save(self.folder.sub(n)) is not None]
        if not complete:
            return
        oldest_kept = complete[-self.keep :][0]
        for name in names:
            if name < oldest_kept:
                remove_save(self.folder.sub(name))

    def wait(self) -> None:
        """Block until the save in flight is written; re-raise its error, if any (a save
        whose folder was removed meanwhile only warns: the class docstring).

        Raises:
            FmsDataError: The error of the save in flight, whatever its class.
        """
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        release(self.wait)
        if self._lost is not None:
            lost, self._lost = self._lost, None
            logger.warning("%s", lost)
            warnings.warn(lost, CheckpointWarning, stacklevel=2)
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def resume_from_folder(loader: Any, root: str, storage: Storage | None = None) -> None:
    """Load into ``loader`` the newest complete checkpoint of an automatic checkpoint
    folder (``checkpoint_dir``), if it holds one; say so when it holds only incomplete
    ones (the loader then starts from the beginning)."""
    latest = latest_checkpoint(root, storage=storage)
    if latest is not None:
        load_loader_state(loader, latest, storage=storage)
        logger.info("resumed the loader from %s, at step %d", latest, loader.steps)
    elif step_folders(root, storage=storage):
        logger.warning(
            "%s holds step_* folders but none is complete (every rank's file of one save): "
            "the loader starts from the beginning",
            root,
        )
