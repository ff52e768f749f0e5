"""What a shared cache folder holds, kept as a running total so trimming costs O(log n).

A cached file is never modified after its download renames it into place: readers in
other processes memory-map it and take a new modification time on the same inode for a
rewrite under them (``handlers.mapping``). A use is recorded on the file's lock file
instead (``LOCK_SUFFIX``, beside it, created by the download): ``mark_used`` sets the lock
file's mtime, and a file's last use (``use_stamp``) is the later of that and the file's own
mtime (its download), which every process sharing the folder reads alike.

Every process that downloads into the cache (DataLoader workers, ranks on the node) keeps
its own ``CacheUsage``: the complete files it knows of with their size and last use, their
byte total, and a heap of them by last use (least recently used first). A download adds
one entry; trimming pops the oldest entries, ``stat``s each one it pops (two calls per
candidate, the file and its lock, not per cached file) and removes it unless a reader
holds it. Nothing walks the folder on that path.

The other processes' downloads and removals are learnt by a full rescan (walk and
``stat`` every file), done on the first trim, and again once this process has downloaded
``rescan_bytes`` since its last rescan or ``rescan_seconds`` have passed. Removals by
others need no rescan to stay correct: a popped entry whose file is gone just leaves the
total; a popped entry that another process used since goes back into the heap with its
new last use, so the heap still yields the true least recently used file it knows of.

Bound: the latest rescan of any process (starting at t0) trims the cache to
``limit_bytes`` (unless files in use hold more); after t0 the cache grows only by downloads,
and a process's downloads since t0 are at most what it downloaded since its own last
rescan: under ``rescan_bytes`` plus the files in flight when it crossed that amount. So
the cache exceeds ``limit_bytes`` by at most, per process sharing it, ``rescan_bytes`` plus
its concurrent downloads (one per prefetch thread and one for the reader), beyond the
bytes of files in use. With one process the total is exact and the cache never exceeds
the limit (files in use aside).
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import logging
import os
import threading
import time
from collections.abc import Callable

from fmsdata.remote.transfer import PARTIAL_SUFFIX, partial_target

__all__ = ["CacheUsage", "LOCK_SUFFIX", "mark_used", "remove_unless_held", "use_stamp"]

logger = logging.getLogger(__name__)

LOCK_SUFFIX = ".fmsdata-lock"
STALE_PARTIAL_S = 3600.0


class CacheUsage:
    """The complete files under a cache folder as one process knows them, and their total.

    Args:
        root: The cache folder (every root's sub-folder under it counts toward the limit).
        limit_bytes: Size the cache is trimmed to (files in use always stay).
        rescan_bytes: Bytes this process downloads between rescans (learning the other
            processes' downloads); the cache may exceed the limit by this much per process.
        rescan_seconds: Longest time between rescans (checked when trimming).
        clock: Seconds, monotonic (tests replace it).
    """

    def __init__(
        self,
        root: str,
        limit_bytes: int,
        rescan_bytes: int,
        rescan_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.root = root
        self.limit_bytes = limit_bytes
        self.rescan_bytes = rescan_bytes
        self.rescan_seconds = rescan_seconds
        self.clock = clock
        self.total = 0
        self.rescans = 0
        self._files: dict[str, tuple[int, int]] = {}  # path -> (size, last use in ns)
        self._heap: list[tuple[int, str]] = []  # (last use, path); stale entries skipped
        self._unscanned = 0  # bytes this process added since its last rescan
        self._scanned_at: float | None = None
        self._lock = threading.Lock()

    def files(self) -> dict[str, int]:
        """Size of each complete file this process knows of, by path."""
        with self._lock:
            return {path: size for path, (size, _) in self._files.items()}

    def added(self, path: str) -> None:
        """``path`` was just downloaded into the cache by this process."""
        stamp = use_stamp(path)
        if stamp is None:  # another process evicted it already
            return
        with self._lock:
            self._record(path, *stamp)
            self._unscanned += stamp[0]

    def trim(self, keep: str) -> None:
        """Remove least recently used files until the total is within the limit, but not
        ``keep`` (just fetched) nor any file a reader holds; rescan first when due."""
        with self._lock:
            if self._rescan_due():
                self._rescan()
            if self.total > self.limit_bytes:
                self._evict(keep)

    def rescan(self) -> None:
        """Learn what the cache holds from the folder itself (walk and ``stat`` it all)."""
        with self._lock:
            self._rescan()

    # -- under the lock --------------------------------------------------------------

    def _rescan_due(self) -> bool:
        return (
            self._scanned_at is None
            or self._unscanned >= self.rescan_bytes
            or self.clock() - self._scanned_at >= self.rescan_seconds
        )

    def _rescan(self) -> None:
        started = self.clock()
        now = time.time()
        files: dict[str, tuple[int, int]] = {}
        for folder, _, names in os.walk(self.root):
            for name in names:
                if name.endswith(LOCK_SUFFIX):
                    continue
                path = os.path.join(folder, name)
                if name.endswith(PARTIAL_SUFFIX):
                    try:
                        stale = now - os.stat(path).st_mtime > STALE_PARTIAL_S
                    except FileNotFoundError:
                        continue
                    if stale:
                        _remove_abandoned(path)
                    continue
                stamp = use_stamp(path)
                if stamp is not None:
                    files[path] = stamp
        self._files = files
        self._heap = [(used, path) for path, (_, used) in files.items()]
        heapq.heapify(self._heap)
        self.total = sum(size for size, _ in files.values())
        self._unscanned = 0
        self._scanned_at = started
        self.rescans += 1

    def _record(self, path: str, size: int, used_ns: int) -> None:
        previous = self._files.get(path)
        if previous is not None:
            self.total -= previous[0]
        self._files[path] = (size, used_ns)
        self.total += size
        if previous is not None and previous[1] == used_ns:
            return  # its heap entry stands
        heapq.heappush(self._heap, (used_ns, path))
        if len(self._heap) > 2 * len(self._files) + 64:  # drop stale entries
            self._heap = [(used, p) for p, (_, used) in self._files.items()]
            heapq.heapify(self._heap)

    def _forget(self, path: str) -> None:
        size, _ = self._files.pop(path)
        self.total -= size

    def _evict(self, keep: str) -> None:
        held: list[tuple[int, str]] = []
        while self.total > self.limit_bytes and self._heap:
            entry = heapq.heappop(self._heap)
            used_ns, path = entry
            known = self._files.get(path)
            if known is None or known[1] != used_ns:
                continue  # superseded by a later entry of the same path
            stamp = use_stamp(path)
            if stamp is None:  # another process removed it
                self._forget(path)
                continue
            if stamp != known:  # used or replaced since
                self._record(path, *stamp)
                continue
            if path == keep or not remove_unless_held(path):
                held.append(entry)
                continue
            self._forget(path)
        for entry in held:
            heapq.heappush(self._heap, entry)
        if self.total > self.limit_bytes:
            logger.warning(
                "fmsdata cache %s holds %d bytes in use, over its %d byte limit",
                self.root,
                self.total,
                self.limit_bytes,
            )


def use_stamp(path: str) -> tuple[int, int] | None:
    """Size and last use (ns) of the cached file ``path``, None when it is gone.

    The last use is the later of the lock file's mtime (``mark_used``) and the file's own
    (its download: a file fetched again after an eviction may be newer than its lock)."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    try:
        used = os.stat(path + LOCK_SUFFIX).st_mtime_ns
    except FileNotFoundError:  # a cache written before uses were kept there
        used = 0
    return stat.st_size, max(stat.st_mtime_ns, used)


def mark_used(path: str) -> None:
    """Record a use of the cached file ``path`` for eviction order, on its lock file (never
    on the file: the module docstring). A use that cannot be recorded (a cache folder
    another user owns) only leaves the file older in the eviction order."""
    lock = path + LOCK_SUFFIX
    try:
        try:
            os.utime(lock)
        except FileNotFoundError:
            with open(lock, "a"):
                pass
    except OSError as err:
        logger.debug("could not record a use of %s: %s", path, err)


def _remove_abandoned(partial: str) -> None:
    """Remove a stale partial download unless its download still runs (holds the lock
    file): a download stalled in retries must not lose the file it writes to."""
    try:
        fd = os.open(partial_target(partial) + LOCK_SUFFIX, os.O_RDONLY)
    except FileNotFoundError:  # no lock: nothing downloads it
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
    finally:
        os.close(fd)


def remove_unless_held(path: str) -> bool:
    """Delete ``path`` unless a reader holds a lock on it; whether it is gone now.

    The lock is taken on an open descriptor and the name is removed only while it still
    names that file, so a fresh copy downloaded (and pinned) under the same name in the
    meantime stays."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            if os.stat(path).st_ino != os.fstat(fd).st_ino:
                return False  # replaced since we opened it: the new file may be in use
            os.remove(path)
        except FileNotFoundError:
            pass
        return True
    finally:
        os.close(fd)
