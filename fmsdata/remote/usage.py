"""What a shared cache folder holds, kept as a running total so trimming costs O(log n).

Every process that downloads into the cache (DataLoader workers, ranks on the node) keeps
its own ``CacheUsage``: the complete files it knows of with their size and mtime, their
byte total, and a heap of them by mtime (least recently used first). A download adds one
entry; trimming pops the oldest entries, ``stat``s each one it pops (one call per
candidate, not per cached file) and removes it unless a reader holds it. Nothing walks
the folder on that path.

The other processes' downloads and removals are learnt by a full rescan (walk and
``stat`` every file), done on the first trim, and again once this process has downloaded
``rescan_bytes`` since its last rescan or ``rescan_seconds`` have passed. Removals by
others need no rescan to stay correct: a popped entry whose file is gone just leaves the
total; a popped entry that another process touched since goes back into the heap with its
new mtime, so the heap still yields the true least recently used file it knows of.

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

import fcntl
import heapq
import logging
import os
import threading
import time
from collections.abc import Callable

from fmsdata.remote.transfer import PARTIAL_SUFFIX

__all__ = ["CacheUsage", "LOCK_SUFFIX", "remove_unless_held"]

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
        self._files: dict[str, tuple[int, int]] = {}  # path -> (size, mtime_ns)
        self._heap: list[tuple[int, str]] = []  # (mtime_ns, path); stale entries skipped
        self._unscanned = 0  # bytes this process added since its last rescan
        self._scanned_at: float | None = None
        self._lock = threading.Lock()

    def files(self) -> dict[str, int]:
        """Size of each complete file this process knows of, by path."""
        with self._lock:
            return {path: size for path, (size, _) in self._files.items()}

    def added(self, path: str) -> None:
        """``path`` was just downloaded into the cache by this process."""
        try:
            stat = os.stat(path)
        except FileNotFoundError:  # another process evicted it already
            return
        with self._lock:
            self._record(path, stat.st_size, stat.st_mtime_ns)
            self._unscanned += stat.st_size

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
                try:
                    stat = os.stat(path)
                except FileNotFoundError:
                    continue
                if name.endswith(PARTIAL_SUFFIX):
                    if now - stat.st_mtime > STALE_PARTIAL_S:
                        remove_unless_held(path)
                    continue
                files[path] = (stat.st_size, stat.st_mtime_ns)
        self._files = files
        self._heap = [(mtime, path) for path, (_, mtime) in files.items()]
        heapq.heapify(self._heap)
        self.total = sum(size for size, _ in files.values())
        self._unscanned = 0
        self._scanned_at = started
        self.rescans += 1

    def _record(self, path: str, size: int, mtime_ns: int) -> None:
        previous = self._files.get(path)
        if previous is not None:
            self.total -= previous[0]
        self._files[path] = (size, mtime_ns)
        self.total += size
        if previous is not None and previous[1] == mtime_ns:
            return  # its heap entry stands
        heapq.heappush(self._heap, (mtime_ns, path))
        if len(self._heap) > 2 * len(self._files) + 64:  # drop stale entries
            self._heap = [(mtime, p) for p, (_, mtime) in self._files.items()]
            heapq.heapify(self._heap)

    def _forget(self, path: str) -> None:
        size, _ = self._files.pop(path)
        self.total -= size

    def _evict(self, keep: str) -> None:
        held: list[tuple[int, str]] = []
        while self.total > self.limit_bytes and self._heap:
            entry = heapq.heappop(self._heap)
            mtime_ns, path = entry
            known = self._files.get(path)
            if known is None or known[1] != mtime_ns:
                continue  # superseded by a later entry of the same path
            try:
                stat = os.stat(path)
            except FileNotFoundError:  # another process removed it
                self._forget(path)
                continue
            if (stat.st_size, stat.st_mtime_ns) != known:  # used or replaced since
                self._record(path, stat.st_size, stat.st_mtime_ns)
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
