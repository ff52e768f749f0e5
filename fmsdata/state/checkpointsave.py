"""One save of the loader state in a checkpoint folder: its files, and when it is complete.

A checkpoint folder (a local path or any fsspec URL, reached through
``fmsdata.remote.folder``) holds, for each rank of the saving run:

- ``loader_rank_00003.fms``: a state file (``fmsdata.state.file``: a zip of ``state.json``
  and ``.npy`` arrays, never unpickled) holding that rank's ``snapshot()``: format
  version, world size, steps, the fingerprint of data and config (which includes the
  number of logical shards), and its logical shards' states;
- ``loader_rank_00003.world_4.step_10.done``: an empty marker, written after the state
  file, whose name says which save that file belongs to (4 ranks, step 10).

**When a save is complete.** Rank 0's marker names the save (world size ``W``, step
``S``); the save is complete when every rank below ``W`` has its state file and the
marker ``(rank, W, S)``. Each file is written whole (a temporary file renamed on local
disk, one PUT on an object store, which has no rename), and a rank writes its marker only
after its state file, so:

- a rank killed in the middle of a save leaves no marker for it: the folder is
  incomplete and never read, and a state file is never seen half written;
- ranks writing one folder at once need no coordination: each writes only its own
  files, and completeness is a property of the listing (no rank waits for the others to
  write a manifest, as torch.distributed.checkpoint's coordinator does after a barrier);
- deciding needs one listing and no state file read, so checking a folder, or resuming,
  costs each rank a few requests whatever the number of ranks (reading every rank's
  header would be ``W`` requests per rank, ``W**2`` for the job).

A rank saving again into a folder deletes its older markers there only after writing the
new ones, so a save that fails before its state file is replaced leaves the previous save
complete; a reader checks that each state file it reads records the save its marker
names, so a file overwritten after its marker was written is an error, never a silent
mix. Folders without any marker (written before markers existed) are judged by the
former rule: every rank's file present and recording the same world size and step.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

from fmsdata.errors import StateMismatchError
from fmsdata.remote.folder import Folder
from fmsdata.state.file import header_from_bytes, state_from_bytes, state_to_bytes

__all__ = [
    "Save",
    "rank_name",
    "marker_name",
    "write_save",
    "state_names",
    "complete_save",
    "one_save",
    "read_rank",
    "remove_save",
]

logger = logging.getLogger(__name__)

_RANK_FILE = re.compile(r"^loader_rank_(\d{5})\.fms$")
_MARKER = re.compile(r"^loader_rank_(\d{5})\.world_(\d+)\.step_(\d+)\.done$")


@dataclasses.dataclass(frozen=True, order=True)
class Save:
    """One rank's part of a save: which rank, of how many, at which step."""

    rank: int
    world_size: int
    steps: int

    def of(self, rank: int) -> Save:
        return dataclasses.replace(self, rank=rank)

    def said(self) -> str:
        return f"step {self.steps} of {self.world_size}"


def rank_name(rank: int) -> str:
    """The name of a rank's state file."""
    return f"loader_rank_{rank:05d}.fms"


def marker_name(save: Save) -> str:
    """The name of the marker saying a rank's state file of ``save`` is written."""
    return f"loader_rank_{save.rank:05d}.world_{save.world_size}.step_{save.steps}.done"


def write_save(snapshot: dict[str, Any], folder: Folder) -> str:
    """Write one rank's ``snapshot`` into ``folder``: its state file, then its marker,
    then this rank's older markers there go. Returns the state file's location.

    Raises:
        FileNotFoundError: The folder was removed while the save was written (names it).
        RemoteIOError: A remote write failed through every retry.
    """
    save = Save(int(snapshot["rank"]), int(snapshot["world_size"]), int(snapshot["steps"]))
    data = state_to_bytes(snapshot)
    path = folder.write(rank_name(save.rank), data)
    marker = marker_name(save)
    folder.write(marker, b"")
    names = folder.names()
    for name, old in _markers(names):
        if old.rank == save.rank and name != marker:
            folder.delete(name)
    # The listing that finds older markers also shows the folder still holds what was
    # written: one removed meanwhile (by hand, by a cleanup job) is recreated by a later
    # write on local disk or is a bare prefix on an object store, never an error there.
    lost = [n for n in (rank_name(save.rank), marker) if n not in names]
    if lost:
        raise FileNotFoundError(
            errno.ENOENT,
            f"{folder.location}: removed while the loader state was saved into it "
            f"({', '.join(lost)} gone)",
        )
    return path


def state_names(names: Iterable[str]) -> dict[int, str]:
    """Rank -> name of the state files among ``names``."""
    return {int(m.group(1)): name for name in names if (m := _RANK_FILE.match(name))}


def _markers(names: Iterable[str]) -> list[tuple[str, Save]]:
    """The markers among ``names``, with the save each names."""
    return [(n, Save(*map(int, m.groups()))) for n in names if (m := _MARKER.match(n))]


def _saves_in(folder: Folder, names: Sequence[str]) -> dict[int, set[Save]]:
    """Per rank with a state file, the saves it is part of. A folder with markers: a
    rank's saves are its markers (none: its save did not finish). A folder without
    (written before markers existed): each file's own record.

    Raises:
        StateMismatchError: A legacy file that cannot be read or records another rank.
        FileNotFoundError: A legacy file vanished meanwhile (another rank pruned it).
    """
    files = state_names(names)
    marked: dict[int, set[Save]] = {}
    for _, save in _markers(names):
        marked.setdefault(save.rank, set()).add(save)
    if marked:
        return {rank: marked.get(rank, set()) for rank in files}
    saves = {}
    for rank, name in files.items():
        path = folder.join(name)
        save = _save_of(header_from_bytes(folder.read(name), path), path)
        if save.rank != rank:
            raise StateMismatchError(f"{folder.join(name)}: holds the state of rank {save.rank}")
        saves[rank] = {save}
    return saves


def _save_of(header: Any, path: str) -> Save:
    """The rank, world size and step a rank file's state (or its JSON part) records.

    Raises:
        StateMismatchError: The fields are missing or not counts.
    """
    found = {k: header.get(k) if isinstance(header, dict) else None for k in _SAVE_FIELDS}
    counts = [v for v in found.values() if type(v) is int and v >= 0]
    if len(counts) != len(_SAVE_FIELDS) or counts[1] < 1:
        raise StateMismatchError(f"{path}: not a loader state of one rank of a save ({found})")
    return Save(*counts)


_SAVE_FIELDS = ("rank", "world_size", "steps")


def _complete(saves: dict[int, set[Save]]) -> Save | None:
    """Rank 0's part of the newest save every one of its ranks has, or None."""
    for first in sorted(saves.get(0, ()), reverse=True):
        if all(first.of(rank) in saves.get(rank, ()) for rank in range(first.world_size)):
            return first
    return None


def complete_save(folder: Folder) -> Save | None:
    """The complete save in ``folder``, or None; files vanishing or unreadable meanwhile
    (another rank pruning it) make it incomplete, never an error."""
    try:
        saves = _saves_in(folder, folder.names())
    except (StateMismatchError, FileNotFoundError):
        return None
    return _complete(saves)


def one_save(folder: Folder) -> tuple[Save, dict[int, str]]:
    """The folder's complete save (rank 0's part) and its state file names by rank."""
    names = folder.names()
    try:
        saves = _saves_in(folder, names)
    except FileNotFoundError as err:
        raise StateMismatchError(
            f"{folder.location}: a file was removed while the checkpoint was read ({err})"
        ) from None
    return _checked(folder, saves), state_names(names)


def read_rank(folder: Folder, files: dict[int, str], part: Save) -> dict[str, Any]:
    """The state of ``part.rank``, checked to record the save ``part`` names."""
    path = folder.join(files[part.rank])
    try:
        data = folder.read(files[part.rank])
    except FileNotFoundError:
        raise StateMismatchError(f"{path}: removed while the checkpoint was read") from None
    state: dict[str, Any] = state_from_bytes(data, path)
    recorded = _save_of(state, path)
    if recorded != part:
        raise StateMismatchError(
            f"{path}: records {recorded.said()} but its save was marked complete at "
            f"{part.said()} (the file was written again after that save)"
        )
    return state


def _checked(folder: Folder, saves: dict[int, set[Save]]) -> Save:
    """The complete save of the folder (rank 0's part), or an error saying why there is
    none: no files, a rank's save unfinished or missing, several saves mixed. Files of
    ranks beyond a complete save's world size are left from another save: not read."""
    where = folder.location
    if not saves:
        raise StateMismatchError(
            f"{where}: no loader state files (loader_rank_*.fms); the folder is empty or absent"
        )
    complete = _complete(saves)
    if complete is not None:
        extra = sorted(rank for rank in saves if rank >= complete.world_size)
        if extra:
            logger.warning(
                "%s: rank files %s are not part of its complete save (%s), left from "
                "another save: not read",
                where,
                extra,
                complete.said(),
            )
        return complete
    unfinished = sorted(rank for rank, own in saves.items() if not own)
    if unfinished:
        names = ", ".join(rank_name(rank) for rank in unfinished)
        raise StateMismatchError(
            f"{where}: the save of {names} did not finish (no loader_rank_NNNNN.world_W."
            "step_S.done marker beside it); a save cut short on that rank"
        )
    first = max(saves[min(saves)])
    missing = [rank for rank in range(first.world_size) if rank not in saves]
    if missing:
        raise StateMismatchError(
            f"{where}: saved by {first.world_size} ranks but {len(missing)} rank file(s) are "
            f"missing: {', '.join(rank_name(rank) for rank in missing)}"
        )
    detail = ", ".join(f"rank {rank}: {max(own).said()}" for rank, own in sorted(saves.items()))
    raise StateMismatchError(
        f"{where}: rank files come from different steps or world sizes ({detail}); "
        "a save that did not finish on every rank"
    )


def remove_save(folder: Folder) -> None:
    """Delete a checkpoint folder. Where the store cannot rename it out of view first, rank
    0's marker goes first (in a folder without markers, its state file): from the first
    delete on, every reader sees the folder incomplete, never a save with files missing."""
    names = folder.names()
    zero = rank_name(0)
    first = [name for name, save in _markers(names) if save.rank == 0]
    folder.remove(first=(*first, zero) if zero in names else tuple(first))
