"""Shard files of a data root as local paths: in place, or pulled into a bounded cache.

Handlers memory-map local files. A local root is read in place (``LocalFiles``); any
other root (``RemoteFiles``) is pulled file by file into a cache folder shared by every
worker and rank on the machine:

- a file is downloaded once per cache folder (a lock file beside it serializes the
  processes and threads wanting it; whoever comes second finds it there) to a partial
  name and renamed when complete, so a crash never leaves a file that looks complete
  (``transfer.fetch``);
- a cached file is never written, replaced or touched after that rename: other
  processes map it, and a change of its mtime or size reads to them as the shard
  rewritten under them (``handlers.mapping``);
- a file in use is pinned with a shared ``flock`` on an open descriptor; eviction takes
  an exclusive lock without waiting, so it never removes a file some reader holds (a
  removed file stays readable through mappings made before; a later pin fetches a new
  copy, a new inode);
- beyond ``limit_bytes`` the least recently used unpinned files go, a use (pin and last
  release) being recorded on the lock file's mtime (``usage.mark_used``); each process
  keeps a running total of the cache instead of walking it per download
  (``usage.CacheUsage``, which states how far several processes may overshoot);
- ``prefetch`` downloads the next file of a stream on a background thread, so the
  stream finds it local when it gets there.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

from fmsdata.remote.retry import retrying
from fmsdata.remote.storage import Storage, is_local
from fmsdata.remote.transfer import fetch, object_info
from fmsdata.remote.usage import LOCK_SUFFIX, CacheUsage, mark_used

__all__ = ["FileSource", "LocalFiles", "RemoteFiles", "file_source"]

logger = logging.getLogger(__name__)


class FileSource(Protocol):
    """Local paths of a root's files, given relative to the root."""

    downloads: bool  # files are fetched before they can be read (prefetch hints pay off)

    def local(self, relative: str) -> str:
        """A readable local path of the file (and its companions); pinned until release."""
        ...

    def prefetch(self, relative: str) -> None:
        """Start making the file local in the background (no effect when it is)."""
        ...

    def release(self, relative: str) -> None:
        """The file (as returned by ``local``) is no longer read."""
        ...

    def close(self) -> None:
        """Stop background work and drop every pin."""
        ...


class LocalFiles:
    """A root on the local filesystem, read in place."""

    downloads = False

    def __init__(self, base: str):
        self.base = base

    def local(self, relative: str) -> str:
        return os.path.join(self.base, relative)

    def prefetch(self, relative: str) -> None:
        return None

    def release(self, relative: str) -> None:
        return None

    def close(self) -> None:
        return None


class RemoteFiles:
    """A remote root's files through a bounded local cache.

    Args:
        root: The root URL.
        storage: How to reach it.
        cache_dir: Cache folder (shared by processes; one sub-folder per root).
        limit_bytes: Size the cache is trimmed to (files in use always stay).
        companions: Other files a shard needs beside it (root-relative), fetched with it.
        prefetch_threads: Background downloads at a time in this process.
        rescan_bytes: Bytes this process downloads between walks of the cache folder (to
            learn the other processes' downloads); default ``limit_bytes // 64``.
        rescan_seconds: Longest time between such walks.
    """

    downloads = True

    def __init__(
        self,
        root: str,
        storage: Storage,
        cache_dir: str,
        limit_bytes: int,
        companions: Callable[[str], list[str]] = lambda relative: [],
        prefetch_threads: int = 4,
        rescan_bytes: int | None = None,
        rescan_seconds: float = 60.0,
    ):
        self.root = root.rstrip("/")
        self.storage = storage
        key = hashlib.blake2b(self.root.encode(), digest_size=10).hexdigest()
        self.folder = os.path.join(cache_dir, key)
        self.limit_bytes = limit_bytes
        self.companions = companions
        self.prefetch_threads = prefetch_threads
        self._pins: dict[str, tuple[int, int]] = {}  # relative -> (fd, count)
        self._lock = threading.Lock()
        self._pending: dict[str, concurrent.futures.Future[str]] = {}
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        rescan = rescan_bytes if rescan_bytes is not None else max(1, limit_bytes // 64)
        self.usage = CacheUsage(cache_dir, limit_bytes, rescan, rescan_seconds)

    # -- paths and downloads ---------------------------------------------------------

    def _target(self, relative: str) -> str:
        return os.path.join(self.folder, *relative.split("/"))

    def _ensure(self, relative: str) -> tuple[str, bool]:
        """The cached file and whether this call downloaded it (under the cross-process
        lock, so two processes never fetch the same file at once)."""
        target = self._target(relative)
        if os.path.exists(target):
            return target, False
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target + LOCK_SUFFIX, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if os.path.exists(target):
                    return target, False
                self._download(relative, target)
                self.usage.added(target)
                return target, True
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _download(self, relative: str, target: str) -> None:
        fs, base = self.storage.filesystem(self.root)
        path = f"{base}/{relative}"
        url = f"{self.root}/{relative}"
        policy = self.storage.retry
        info = object_info(retrying(policy, url, fs.info, path, what="stat"))
        start = time.perf_counter()
        fetch(fs, path, url, target, info, policy, verify_md5=False)
        logger.debug("fetched %s (%d bytes) in %.2fs", url, info.size, time.perf_counter() - start)

    # -- FileSource ------------------------------------------------------------------

    def local(self, relative: str) -> str:
        for name in (relative, *self.companions(relative)):
            self._pin(name)
        return self._target(relative)

    def _pin(self, relative: str) -> None:
        with self._lock:
            held = self._pins.get(relative)
            if held is not None:
                self._pins[relative] = (held[0], held[1] + 1)
                return
        pending = self._pending.get(relative)
        if pending is not None and not pending.cancel():  # queued: fetched below instead
            try:
                pending.result()
            except Exception:  # the download below retries and reports it
                pass
        while True:
            target, downloaded = self._ensure(relative)
            try:
                fd = os.open(target, os.O_RDONLY)
            except FileNotFoundError:
                continue  # evicted between the download and the pin: fetch again
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                same = os.stat(target).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # evicted while we waited for the lock
        mark_used(target)
        with self._lock:
            held = self._pins.get(relative)
            if held is not None:
                os.close(fd)
                self._pins[relative] = (held[0], held[1] + 1)
            else:
                self._pins[relative] = (fd, 1)
        if downloaded:
            self.usage.trim(keep=target)

    def release(self, relative: str) -> None:
        for name in (relative, *self.companions(relative)):
            with self._lock:
                held = self._pins.get(name)
                if held is None:
                    continue
                fd, count = held
                if count > 1:
                    self._pins[name] = (fd, count - 1)
                    continue
                del self._pins[name]
            mark_used(self._target(name))  # used until now: eviction order counts from here
            os.close(fd)  # drops the shared lock

    def over_limit(self) -> bool:
        """Whether the cache holds more than ``limit_bytes`` (as this process counts it)."""
        return self.usage.total > self.limit_bytes

    def prefetch(self, relative: str) -> None:
        if os.path.exists(self._target(relative)):
            return
        with self._lock:
            if relative in self._pending and not self._pending[relative].done():
                return
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    self.prefetch_threads, thread_name_prefix="fmsdata-prefetch"
                )
            self._pending[relative] = self._pool.submit(self._prefetch, relative)

    def _prefetch(self, relative: str) -> str:
        try:
            for name in self.companions(relative):
                self._ensure(name)
            target, downloaded = self._ensure(relative)
            if downloaded:
                self.usage.trim(keep=target)
            return target
        except Exception as err:  # the reader's own fetch retries and raises it
            logger.debug("prefetch of %s/%s failed: %s", self.root, relative, err)
            raise

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        with self._lock:
            pins, self._pins = self._pins, {}
        for fd, _ in pins.values():
            os.close(fd)


def file_source(
    root: str,
    storage: Storage,
    cache_dir: str,
    limit_bytes: int,
    companions: Callable[[str], list[str]] = lambda relative: [],
) -> LocalFiles | RemoteFiles:
    """The right source for ``root``: in place when local, else through the cache."""
    fs, base = storage.filesystem(root)
    if is_local(fs):
        return LocalFiles(base)
    return RemoteFiles(root, storage, cache_dir, limit_bytes, companions)
