"""Read-only memory maps of shard files whose resident pages can be given back.

Handlers read tokens as views of memory-mapped files. Pages touched through a mapping
count in the process's resident memory until unmapped, so a long run over many open files
would grow its RSS with the corpus; ``release`` drops them (the kernel keeps them in the
page cache, a later read maps them again) and keeps a worker's memory flat.

Reading a page of a mapping whose file was cut short kills the process with SIGBUS, which
leaves no Python message. So a DataLoader worker, and a process whose fault note runs
(``fault_note``), keep the list of their mapped files in a small file named by the pid
(``list_path``) that outlives them: the main process checks a dead worker's list, and the
fault note's stack dump points to it. The list is a journal (a line appended per file
mapped or closed, rewritten when mostly closed lines), so a process holding thousands of
mappings pays O(1) per file opened, and every line is written before the file's first
page is read.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import itertools
import mmap
import os
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator

import numpy as np

from fmsdata.errors import ShardFormatError
from fmsdata.handlers import fault_note

__all__ = [
    "MappedFile",
    "changed_in_dead_workers",
    "forget_worker_lists",
    "list_path",
    "mapped_paths",
    "recording",
    "resident_file_bytes",
    "sweep_stale_lists",
]


class MappedFile:
    """A whole file mapped read-only; ``bytes`` is a uint8 view of it.

    The file's size, modification time and inode are recorded when it is mapped:
    ``check_unchanged`` compares them with the file now. Reading a page of a mapping whose
    file was cut short since kills the process with SIGBUS, so readers check before they
    read (see ``fmsdata.data.access``), and DataLoader workers list their mapped files where
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
        key = next(_SERIAL)
        self._key = key
        _mapped(key, path, self.stamp)
        # Listed until the mapping itself is gone: closed or dropped, a file stays mapped
        # while any array views it (a copy holds the token buffers of a whole item), and
        # a fault reading it must still find it listed.
        self._forget = weakref.finalize(self._map, _collected, key)
        self._forget.atexit = False
        for made in getattr(_RECORDERS, "stack", ()):
            made.append(self)

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
        """Forget the mapping; it is unmapped, and leaves the list of mapped files, once no
        array views of it remain.

        Returns the empty array ``bytes`` now is. Safe during interpreter shutdown, when
        module globals may already be gone.
        """
        self.bytes = self._CLOSED
        self._map = None
        with contextlib.suppress(AttributeError, TypeError), _LOCK:  # shutdown: globals gone
            _forget_collected()  # (one just closed without views left among them)
        return self._CLOSED


# This process's open mappings, oldest first: serial key -> (path, stamp).
_OPEN: dict[int, tuple[str, tuple[int, int, int]]] = {}
_SERIAL = itertools.count()
_RECORDERS = threading.local()
_NEWEST = 8  # files the fault note names inline (faulthandler cuts a name at 500 characters)


@contextlib.contextmanager
def recording() -> Iterator[list[MappedFile]]:
    """The files mapped by this thread inside the block, listed as they are mapped: what a
    reader cache checks at each access, found without looking at the other mappings."""
    made: list[MappedFile] = []
    stack = getattr(_RECORDERS, "stack", None)
    if stack is None:
        stack = _RECORDERS.stack = []
    stack.append(made)
    try:
        yield made
    finally:
        stack.remove(made)


def mapped_paths() -> list[str]:
    """The paths of this process's open mappings, oldest first (a copy)."""
    with _LOCK:
        _forget_collected()
        return [path for path, _ in _OPEN.values()]


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


def list_path(pid: int) -> str:
    """Where process ``pid`` lists its mapped files (while it is a DataLoader worker or
    its fault note runs)."""
    return os.path.join(tempfile.gettempdir(), f"fmsdata-maps-{pid}.tsv")


_HEADER = (
    "# files mapped by process {pid}: '+ key size mtime_ns inode path' mapped, '- key' closed\n"
)


class _Journal:
    """This process's list of mapped files, appended a line at a time (``O_APPEND`` writes
    reach the file before the process can fault) and rewritten from ``_OPEN`` once most of
    its lines are closed ones, so its size stays proportional to the open mappings."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.path = list_path(self.pid)
        self.lines = 0
        self.fd = -1
        self.rewrite()

    def rewrite(self) -> None:
        lines = [_HEADER.format(pid=self.pid)]
        lines += [_added(key, path, stamp) for key, (path, stamp) in list(_OPEN.items())]
        try:
            with open(self.path + ".tmp", "w", encoding="utf-8") as out:
                out.write("".join(lines))
            os.replace(self.path + ".tmp", self.path)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError:
            fd = -1  # only a diagnosis is lost
        if self.fd >= 0:
            os.close(self.fd)
        self.fd, self.lines = fd, len(lines)

    def add(self, line: str) -> None:
        if self.fd < 0:
            return
        try:
            os.write(self.fd, line.encode())
        except OSError:
            return
        self.lines += 1
        if self.lines > 2 * len(_OPEN) + 64:
            self.rewrite()


def _added(key: int, path: str, stamp: tuple[int, int, int]) -> str:
    return f"+\t{key}\t{stamp[0]}\t{stamp[1]}\t{stamp[2]}\t{path}\n"


_journal: _Journal | None = None
_FINALIZER = None


def _in_worker() -> bool:
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


def _listing() -> _Journal | None:
    """This process's journal if it keeps one (a DataLoader worker, or a process whose
    fault note runs), opened with every open mapping the first time."""
    global _journal, _FINALIZER
    if _journal is not None:
        if _journal.pid == os.getpid():
            return _journal
        with contextlib.suppress(OSError):  # inherited through fork: the parent's
            os.close(_journal.fd)
        _journal = None
    if not (fault_note.running() or _in_worker()):
        return None
    sweep_stale_lists()
    _journal = _Journal()
    if _in_worker():  # workers end through multiprocessing, which runs finalizers
        import multiprocessing.util

        _FINALIZER = multiprocessing.util.Finalize(
            None, forget_worker_lists, args=([os.getpid()],), exitpriority=0
        )
    else:
        atexit.register(forget_worker_lists, [os.getpid()])
    return _journal


def _tell_note(journal: _Journal | None) -> None:
    if fault_note.running():
        newest = [path for path, _ in itertools.islice(reversed(_OPEN.values()), _NEWEST)]
        fault_note.update(newest, len(_OPEN), journal.path if journal is not None else None)


# Held while the list changes: threads may map files side by side; re-entered when a
# mapping dropped without ``close`` is collected in the middle of a change.
_LOCK = threading.RLock()


_fork_hooked = False


def _new_lock_after_fork() -> None:
    global _LOCK
    _LOCK = threading.RLock()


def _mapped(key: int, path: str, stamp: tuple[int, int, int]) -> None:
    """Record a new mapping. ``_OPEN`` changes only under ``_LOCK``: threads map files side
    by side while another lists them (``publish``)."""
    global _fork_hooked
    if not _fork_hooked:  # a fork while another thread holds the lock would keep it held
        os.register_at_fork(after_in_child=_new_lock_after_fork)
        _fork_hooked = True
    with _LOCK:
        _forget_collected()
        _OPEN[key] = (path, stamp)
        journal = _listing()
        if journal is not None:
            journal.add(_added(key, path, stamp))
        _tell_note(journal)


# Keys of mappings collected without ``close``. Their finalizer may run inside any
# allocation (a garbage collection), even while this thread lists ``_OPEN``: it only queues
# the key, and the next change of the list, under the lock, forgets it.
_COLLECTED: collections.deque[int] = collections.deque()


def _collected(key: int) -> None:
    _COLLECTED.append(key)


def _forget_collected() -> None:
    """Forget the mappings collected since the last change (the lock is held)."""
    while _COLLECTED:
        _unmapped(_COLLECTED.popleft())


def _unmapped(key: int) -> None:
    global _journal
    with _LOCK:
        if _OPEN.pop(key, None) is None:
            return
        journal = _listing()
        if journal is not None and not _OPEN:
            # Nothing mapped: no list (a worker stopped without its finalizers, as when a
            # DataLoader terminates it, leaves none behind); the next mapping starts one.
            if journal.fd >= 0:
                os.close(journal.fd)
            forget_worker_lists([journal.pid])
            _journal = journal = None
        elif journal is not None:
            journal.add(f"-\t{key}\n")
        _tell_note(journal)


def publish() -> None:
    """List every open mapping now (the fault note calls it when it starts)."""
    with _LOCK:
        _forget_collected()
        journal = _listing()
        if journal is not None:
            journal.rewrite()
        _tell_note(journal)


def _read_list(path: str) -> dict[str, tuple[str, tuple[int, int, int]]]:
    """The mappings a journal leaves open (a last line cut by the process's death skipped)."""
    found: dict[str, tuple[str, tuple[int, int, int]]] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            fields = line.rstrip("\n").split("\t")
            if fields[0] == "+" and len(fields) == 6 and line.endswith("\n"):
                size, mtime, inode = (int(v) for v in fields[2:5])
                found[fields[1]] = (fields[5], (size, mtime, inode))
            elif fields[0] == "-" and len(fields) == 2:
                found.pop(fields[1], None)
    return found


def changed_in_dead_workers(pids: list[int]) -> list[str]:
    """Messages naming the mapped files of these (dead) worker processes that changed
    since they were mapped; their lists are removed."""
    found = []
    for pid in pids:
        path = list_path(pid)
        try:
            mapped = _read_list(path)
            os.unlink(path)
        except (OSError, ValueError):
            continue
        for name, stamp in mapped.values():
            problem = _change(name, stamp)
            if problem is not None:
                found.append(f"{name}: {problem}")
    return found


# A list outlives its process when the process dies with its main process (a job killed
# whole: SIGKILL to the group) or before the main process looks; each process that starts a
# list removes the lists of processes that are gone, once older than this, so that a main
# process (which reads its dead worker's list as soon as it notices, within seconds) is
# done with them.
STALE_LIST_S = 300.0


def sweep_stale_lists(older_than: float = STALE_LIST_S) -> list[int]:
    """Remove the mapped-file lists of processes that no longer exist, not written for
    ``older_than`` seconds; returns their pids."""
    folder = tempfile.gettempdir()
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    gone = []
    now = time.time()
    for name in names:
        if not (name.startswith("fmsdata-maps-") and name.endswith(".tsv")):
            continue
        try:
            pid = int(name[len("fmsdata-maps-") : -len(".tsv")])
            os.kill(pid, 0)
            continue  # alive (or another user's: PermissionError, an OSError, below)
        except ValueError:
            continue
        except ProcessLookupError:
            pass
        except OSError:
            continue
        path = os.path.join(folder, name)
        with contextlib.suppress(OSError):
            if now - os.stat(path).st_mtime >= older_than:
                os.unlink(path)
                gone.append(pid)
    return gone


def forget_worker_lists(pids: list[int]) -> None:
    """Remove the mapped-file lists of processes that ended."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.unlink(list_path(pid))


def resident_file_bytes() -> int | None:
    """Bytes of this process's resident memory backed by files (None off Linux)."""
    try:
        with open("/proc/self/statm") as statm:
            fields = statm.read().split()
    except OSError:
        return None
    return int(fields[2]) * os.sysconf("SC_PAGE_SIZE")
