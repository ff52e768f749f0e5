"""The local cache of a remote root's files, over fsspec's in-memory filesystem: bounded
LRU that never evicts a file in use, partial downloads that never look complete,
background prefetch, retries and their limits."""

import errno
import os

import fsspec
import pytest

from fmsdata.errors import RemoteIOError
from fmsdata.remote.cache import RemoteFiles
from fmsdata.remote.retry import RetryPolicy, is_transient, retrying
from fmsdata.remote.storage import Storage
from fmsdata.remote.transfer import PARTIAL_SUFFIX, ObjectInfo, fetch

FAST = Storage(retry=RetryPolicy(tries=4, backoff=0.0))


@pytest.fixture
def memory_root(request):
    fs = fsspec.filesystem("memory")
    root = f"memory://{request.node.name}"
    for i in range(4):
        fs.pipe(f"{root}/data/f{i}.bin", bytes([i]) * 1000)
    yield root
    fs.rm(root, recursive=True)


def cached_files(folder):
    return sorted(
        name for _, _, names in os.walk(folder) for name in names if name.endswith(".bin")
    )


def test_files_are_fetched_once_and_read_locally(memory_root, tmp_path):
    source = RemoteFiles(memory_root, FAST, str(tmp_path), limit_bytes=1 << 20)
    path = source.local("data/f1.bin")
    assert open(path, "rb").read() == bytes([1]) * 1000
    fsspec.filesystem("memory").pipe(f"{memory_root}/data/f1.bin", b"changed")
    assert source.local("data/f1.bin") == path  # served from the cache, not fetched again
    assert open(path, "rb").read() == bytes([1]) * 1000
    source.release("data/f1.bin")
    source.release("data/f1.bin")
    source.close()


def test_least_recently_used_files_go_but_never_one_in_use(memory_root, tmp_path):
    source = RemoteFiles(memory_root, FAST, str(tmp_path), limit_bytes=2500)
    source.local("data/f0.bin")  # pinned throughout
    source.local("data/f1.bin")
    source.release("data/f1.bin")
    # f2 takes the cache to 3000 bytes: the least recently used unpinned file goes.
    source.local("data/f2.bin")
    assert cached_files(tmp_path) == ["f0.bin", "f2.bin"]
    source.release("data/f2.bin")
    source.local("data/f3.bin")
    assert cached_files(tmp_path) == ["f0.bin", "f3.bin"]
    # Everything pinned: the cache goes over its bound rather than remove a file in use.
    source.local("data/f1.bin")
    assert cached_files(tmp_path) == ["f0.bin", "f1.bin", "f3.bin"]
    source.close()
    # Pins of another process (an open descriptor with a shared lock) are honoured too.
    other = RemoteFiles(memory_root, FAST, str(tmp_path), limit_bytes=1000)
    other.local("data/f3.bin")
    source = RemoteFiles(memory_root, FAST, str(tmp_path), limit_bytes=1000)
    source.local("data/f2.bin")
    assert cached_files(tmp_path) == ["f2.bin", "f3.bin"]
    other.close()
    source.close()


def test_prefetch_downloads_in_the_background(memory_root, tmp_path):
    source = RemoteFiles(memory_root, FAST, str(tmp_path), limit_bytes=1 << 20)
    source.prefetch("data/f2.bin")
    source._pending["data/f2.bin"].result(timeout=30)
    assert cached_files(tmp_path) == ["f2.bin"]
    source.prefetch("data/f2.bin")  # already local: nothing to do
    assert open(source.local("data/f2.bin"), "rb").read() == bytes([2]) * 1000
    source.close()


def test_companions_come_with_their_shard(memory_root, tmp_path):
    fsspec.filesystem("memory").pipe(f"{memory_root}/data/f1.idx", b"index")
    source = RemoteFiles(
        memory_root,
        FAST,
        str(tmp_path),
        1 << 20,
        companions=lambda rel: [rel.replace(".bin", ".idx")],
    )
    source.local("data/f1.bin")
    assert sorted(os.listdir(os.path.dirname(source._target("data/f1.bin")))) == [
        "f1.bin",
        "f1.bin.fmsdata-lock",
        "f1.idx",
        "f1.idx.fmsdata-lock",
    ]
    source.close()


class Flaky:
    """A filesystem whose ranged reads fail on a schedule."""

    def __init__(self, fs, failures):
        self.fs = fs
        self.failures = list(failures)
        self.calls = 0

    def cat_file(self, path, start=None, end=None):
        self.calls += 1
        if self.failures:
            failure = self.failures.pop(0)
            if failure is not None:
                raise failure
        return self.fs.cat_file(path, start=start, end=end)


def test_transient_read_failures_are_retried(memory_root, tmp_path):
    fs = fsspec.filesystem("memory")
    path = f"{memory_root}/data/f3.bin".removeprefix("memory://")
    flaky = Flaky(fs, [None, OSError(errno.EREMOTEIO, "Internal Server Error"), TimeoutError()])
    fetch(
        flaky,
        path,
        "memory://x",
        str(tmp_path / "out"),
        ObjectInfo(1000),
        FAST.retry,
        chunk_bytes=300,
    )
    assert (tmp_path / "out").read_bytes() == bytes([3]) * 1000
    assert flaky.calls == 4 + 2


def test_a_crash_mid_download_leaves_only_a_partial_that_the_next_fetch_continues(
    memory_root, tmp_path
):
    fs = fsspec.filesystem("memory")
    path = f"{memory_root}/data/f2.bin".removeprefix("memory://")
    target = tmp_path / "out.bin"
    broken = Flaky(fs, [None, None, PermissionError("denied")])  # permanent: no retry
    with pytest.raises(RemoteIOError, match=r"memory://x failed: PermissionError"):
        fetch(
            broken, path, "memory://x", str(target), ObjectInfo(1000), FAST.retry, chunk_bytes=300
        )
    assert not target.exists()
    (partial,) = [p for p in os.listdir(tmp_path) if p.endswith(PARTIAL_SUFFIX)]
    assert os.path.getsize(tmp_path / partial) == 600
    counting = Flaky(fs, [])
    moved = fetch(
        counting, path, "memory://x", str(target), ObjectInfo(1000), FAST.retry, chunk_bytes=300
    )
    assert moved == 400 and counting.calls == 2
    assert target.read_bytes() == bytes([2]) * 1000
    assert not [p for p in os.listdir(tmp_path) if p.endswith(PARTIAL_SUFFIX)]


def test_a_size_or_md5_mismatch_is_an_error_and_leaves_nothing(memory_root, tmp_path):
    fs = fsspec.filesystem("memory")
    path = f"{memory_root}/data/f1.bin".removeprefix("memory://")
    with pytest.raises(RemoteIOError, match="does not match ETag"):
        fetch(fs, path, "memory://x", str(tmp_path / "a"), ObjectInfo(1000, "0" * 32), FAST.retry)
    with pytest.raises(RemoteIOError, match="returned 1000 bytes"):
        fetch(fs, path, "memory://x", str(tmp_path / "b"), ObjectInfo(1200), FAST.retry)
    assert sorted(os.listdir(tmp_path)) == [
        p for p in sorted(os.listdir(tmp_path)) if p.endswith(PARTIAL_SUFFIX)
    ]
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_retry_limits():
    calls = []

    def always(exc):
        def call():
            calls.append(1)
            raise exc

        return call

    with pytest.raises(RemoteIOError, match=r"read s3://b/k failed after 4 tries; last error"):
        retrying(FAST.retry, "s3://b/k", always(ConnectionResetError("reset")))
    assert len(calls) == 4
    calls.clear()
    with pytest.raises(FileNotFoundError, match="no such object: s3://b/k"):
        retrying(FAST.retry, "s3://b/k", always(FileNotFoundError("b/k")))
    assert len(calls) == 1
    calls.clear()
    with pytest.raises(RemoteIOError, match="s3://b/k failed: PermissionError"):
        retrying(FAST.retry, "s3://b/k", always(PermissionError("denied")))
    assert len(calls) == 1
    assert is_transient(OSError(errno.EBUSY, "SlowDown"))
    assert not is_transient(ValueError("bad"))
    delays = [RetryPolicy(backoff=0.5, max_backoff=4).delay(k) for k in range(8)]
    bases = [min(0.5 * 2**k, 4) for k in range(8)]  # doubling, capped, plus jitter
    assert all(b <= d <= 1.5 * b for b, d in zip(bases, delays))


def test_storage_never_shows_credentials():
    storage = Storage(endpoint_url="http://127.0.0.1:9", options={"secret": "hunter2"})
    assert "hunter2" not in repr(storage)
