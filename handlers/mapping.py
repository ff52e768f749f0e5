"""Read-only memory maps of shard files whose resident pages can be given back.

Handlers read tokens as views of memory-mapped files. Pages touched through a mapping
count in the process's resident memory until unmapped, so a long run over many open files
would grow its RSS with the corpus; ``release`` drops them (the kernel keeps them in the
page cache, a later read maps them again) and keeps a worker's memory flat.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
import tempfile
import weakref

import numpy as np

from fmsdata.errors import ShardFormatError
from fmsdata.handlers import fault_note

__all__ = [
    "MappedFile",
    "changed_in_dead_workers",
    "forget_worker_lists",
    "live_mappings",
    "resident_file_bytes",
]


class MappedFile:
    """A whole file mapped read-only; ``bytes`` is a uint8 view of it.

    The file's size, modification time and inode are recorded when it is mapped:
    ``check_unchanged`` compares them with the file now. Reading a page of a mapping whose
    file was cut short since kills the process with SIGBUS, so readers check before they
    read (see ``fmsdata.access``), and DataLoader workers list their mapped files where
    the main process finds them if one dies (``changed_in_dead_workers``).
    """

    _CLOSED = np.empty(0, dtype=np.uint8)  # what ``bytes`` is after ``close``

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as handle:
            stat = os.fstat(handle.fileno())
            if stat.st_size == 0:
                raise ShardFormatError(f"{path}: file is empty")
            self._map: mmap.mmap | None = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        self.stamp = (stat.st_size, stat.st_mtime_ns, stat.st_ino)
        self.bytes = np.frombuffer(self._map, dtype=np.uint8)
        _LIVE[id(self)] = self
        _publish()

    def check_unchanged(self) -> None:
        """Raise ``ShardFormatError`` naming the file if it was rewritten in place since it
        was mapped (a file replaced by rename leaves the mapping valid: not an error)."""
        problem = _change(self.path, self.stamp)
        if problem is not None:
            raise ShardFormatError(f"{self.path}: {problem}")

    def view(self, dtype: np.dtype, offset: int = 0, count: int = -1) -> np.ndarray:
        """The file (from ``offset``) as an array of ``dtype`` (whole items only)."""
        if count < 0:
            count = (len(self.bytes) - offset) // np.dtype(dtype).itemsize
        return self.bytes[offset : offset + count * np.dtype(dtype).itemsize].view(dtype)

    def release(self) -> None:
        """Give back the resident pages of the mapping (contents stay readable)."""
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def close(self) -> np.ndarray:
        """Forget the mapping; it is unmapped once no array views of it remain.

        Returns the empty array ``bytes`` now is. Safe during interpreter shutdown, when
        module globals may already be gone.
        """
        self.bytes = self._CLOSED
        self._map = None
        try:
            if _LIVE.pop(id(self), None) is not None:
                _publish()
        except (AttributeError, TypeError):  # interpreter shutdown: module globals are gone
            pass
        return self._CLOSED


# This process's open mappings (weak: a reader dropped without close frees its mapping).
_LIVE: weakref.WeakValueDictionary[int, MappedFile] = weakref.WeakValueDictionary()


def live_mappings() -> dict[int, MappedFile]:
    """This process's open mappings by id (a copy)."""
    return dict(_LIVE.items())  # items() defers removals by the collector: a safe copy


def _change(path: str, stamp: tuple[int, int, int]) -> str | None:
    """How the file at ``path`` differs from ``stamp`` (size, mtime_ns, inode), or None."""
    try:
        now = os.stat(path)
    except OSError as err:
        return f"changed while being read (now unreadable: {err.strerror})"
    size, mtime, inode = stamp
    if now.st_ino != inode or (now.st_size, now.st_mtime_ns) == (size, mtime):
        return None
    return (
        f"changed while being read (size {size} -> {now.st_size} bytes, modified again); "
        "a shard must not be rewritten while a loader reads it"
    )


_FINALIZER = None


def _list_path(pid: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"fmsdata-maps-{pid}.tsv")


def _in_worker() -> bool:
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


def _publish() -> None:
    """In a DataLoader worker, keep the list of mapped files in a small file named by the
    pid, for the main process to check if the worker dies (a SIGBUS leaves no message);
    in any process, tell the fault note which files are mapped."""
    fault_note.update(m.path for m in _LIVE.values())
    if not _in_worker():
        return
    path = _list_path(os.getpid())
    if not _LIVE:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    global _FINALIZER
    if _FINALIZER is None:  # workers end through multiprocessing, which runs finalizers
        import multiprocessing.util

        _FINALIZER = multiprocessing.util.Finalize(
            None, forget_worker_lists, args=([os.getpid()],), exitpriority=0
        )
    lines = "".join(f"{m.stamp[0]}\t{m.stamp[1]}\t{m.stamp[2]}\t{m.path}\n" for m in _LIVE.values())
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as out:
            out.write(lines)
        os.replace(path + ".tmp", path)
    except OSError:
        pass  # only a diagnosis is lost


def changed_in_dead_workers(pids: list[int]) -> list[str]:
    """Messages naming the mapped files of these (dead) worker processes that changed
    since they were mapped; their lists are removed."""
    found = []
    for pid in pids:
        path = _list_path(pid)
        try:
            with open(path, encoding="utf-8") as handle:
                lines = handle.read().splitlines()
            os.unlink(path)
        except OSError:
            continue
        for line in lines:
            size, mtime, inode, name = line.split("\t", 3)
            problem = _change(name, (int(size), int(mtime), int(inode)))
            if problem is not None:
                found.append(f"{name}: {problem}")
    return found


def forget_worker_lists(pids: list[int]) -> None:
    """Remove the mapped-file lists of workers that ended."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.unlink(_list_path(pid))


def resident_file_bytes() -> int | None:
    """Bytes of this process's resident memory backed by files (None off Linux)."""
    try:
        with open("/proc/self/statm") as statm:
            fields = statm.read().split()
    except OSError:
        return None
    return int(fields[2]) * os.sysconf("SC_PAGE_SIZE")
