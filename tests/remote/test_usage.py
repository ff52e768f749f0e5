"""The cache's running total (``fmsdata.remote.usage``): it agrees with the folder itself,
a download no longer walks the cache, and the limit holds when other processes fill it.
Processes sharing the folder fetch each file once and never change a file another maps."""

import collections
import fcntl
import multiprocessing
import os
import tempfile

import fsspec
from hypothesis import given, settings
from hypothesis import strategies as st

from fmsdata.handlers.mapping import MappedFile
from fmsdata.remote import usage as usage_module
from fmsdata.remote.cache import RemoteFiles
from fmsdata.remote.retry import RetryPolicy
from fmsdata.remote.storage import Storage
from fmsdata.remote.transfer import PARTIAL_SUFFIX, ObjectInfo, partial_path
from fmsdata.remote.usage import (
    LOCK_SUFFIX,
    CacheUsage,
    mark_used,
    remove_unless_held,
    use_stamp,
)

FAST = Storage(retry=RetryPolicy(tries=4, backoff=0.0))


def on_disk(folder, uses=None):
    """path -> (size, inode) of every complete file under ``folder``, walked here (and
    their last uses into ``uses``: the later mtime of the file and of its lock file)."""
    found = {}
    for parent, _, names in os.walk(folder):
        for name in names:
            if not name.endswith((LOCK_SUFFIX, PARTIAL_SUFFIX)):
                path = os.path.join(parent, name)
                stat = os.stat(path)
                found[path] = (stat.st_size, stat.st_ino)
                if uses is not None:
                    lock = path + LOCK_SUFFIX
                    locked = os.stat(lock).st_mtime_ns if os.path.exists(lock) else 0
                    uses[path] = max(stat.st_mtime_ns, locked)
    return found


def used_at(path, seconds):
    """Make ``path``'s last use ``seconds`` (its mtime and its lock file's)."""
    with open(path + LOCK_SUFFIX, "a"):
        pass
    os.utime(path, (seconds, seconds))
    os.utime(path + LOCK_SUFFIX, (seconds, seconds))


def total(found):
    return sum(size for size, _ in found.values())


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def remote_root(name, sizes, companions=False):
    fs = fsspec.filesystem("memory")
    root = f"memory://{name}"
    for i, size in enumerate(sizes):
        fs.pipe(f"{root}/data/f{i}.bin", bytes([i % 251]) * size)
        if companions:
            fs.pipe(f"{root}/data/f{i}.idx", b"i" * (size % 50 + 1))
    return root


def index_of(relative):
    return [relative.replace(".bin", ".idx")]


def write_as_another_process(path, size, mtime=None):
    """A complete file appears under its name, as another process's download leaves it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + PARTIAL_SUFFIX, "wb") as out:
        out.write(b"x" * size)
    os.replace(path + PARTIAL_SUFFIX, path)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


operations = st.lists(
    st.one_of(
        st.tuples(st.just("get"), st.integers(0, 7)),  # read a file and let it go
        st.tuples(st.just("pin"), st.integers(0, 7)),  # read a file and keep it open
        st.tuples(st.just("release"), st.integers(0, 7)),
        st.tuples(st.just("other get"), st.integers(0, 7)),  # another process's cache
        st.tuples(st.just("other write"), st.integers(1, 600)),
        st.tuples(st.just("other remove"), st.integers(0, 50)),
        st.tuples(st.just("other touch"), st.integers(0, 50)),
        st.tuples(st.just("rescan"), st.just(0)),
    ),
    max_size=30,
)


@settings(max_examples=150)
@given(
    sizes=st.lists(st.integers(1, 700), min_size=8, max_size=8),
    limit=st.integers(300, 4000),
    ops=operations,
)
def test_the_running_total_agrees_with_a_rescan_of_the_folder(sizes, limit, ops):
    """Against an independent walk of the folder after every step: the total is exact
    while only this process changes the cache, off by at most what others wrote or removed
    since its last rescan otherwise, and exact again after a rescan. After each of its
    downloads the total is within the limit unless every file it knows of is in use, and
    what it removed was used less recently than every file it knows of and kept."""
    with tempfile.TemporaryDirectory() as cache:
        root = remote_root(f"usage-{os.getpid()}-{id(ops)}", sizes, companions=True)
        clock = Clock()
        mine = RemoteFiles(root, FAST, cache, limit, index_of, rescan_bytes=1 << 40)
        mine.usage.clock = clock
        other = RemoteFiles(root, FAST, cache, limit, index_of, rescan_bytes=1 << 40)
        usage = mine.usage
        pinned: dict[str, int] = {}
        written = removed = 0  # bytes others wrote / removed since this process's rescan
        extra = 0
        try:
            for op, arg in ops:
                used: dict[str, int] = {}
                before = on_disk(cache, used)
                relative = f"data/f{arg}.bin"
                downloaded = False
                if op in ("get", "pin"):
                    downloaded = not all(
                        os.path.exists(mine._target(x)) for x in (relative, *index_of(relative))
                    )
                    assert open(mine.local(relative), "rb").read() == bytes([arg]) * sizes[arg]
                    if op == "get":
                        mine.release(relative)
                    else:
                        pinned[relative] = pinned.get(relative, 0) + 1
                elif op == "release" and pinned.get(relative):
                    mine.release(relative)
                    pinned[relative] -= 1
                elif op == "other get":
                    other.local(relative)
                    other.release(relative)
                elif op == "other write":
                    extra += 1
                    write_as_another_process(os.path.join(cache, "x", f"o{extra}.bin"), arg)
                elif op in ("other remove", "other touch") and before:
                    path = sorted(before)[arg % len(before)]
                    if op == "other touch":  # a use, recorded as another process does
                        with open(path + LOCK_SUFFIX, "a"):
                            pass
                        os.utime(path + LOCK_SUFFIX, ns=(0, used[path] + 10**9))
                    else:
                        with open(path, "rb") as probe:  # as another process's trim
                            try:
                                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                                os.remove(path)
                            except BlockingIOError:
                                pass
                elif op == "rescan":  # the interval passes; the next trim rescans
                    clock.now += usage.rescan_seconds
                    usage.trim(keep="")
                    written = removed = 0
                after = on_disk(cache)
                if op not in ("get", "pin", "release", "rescan"):  # others changed it
                    written += sum(s[0] for p, s in after.items() if before.get(p) != s)
                    removed += sum(s[0] for p, s in before.items() if after.get(p) != s)
                mine_known = usage.files()
                assert usage.total == sum(mine_known.values())
                assert total(after) - written <= usage.total <= total(after) + removed
                if written == removed == 0:
                    assert mine_known == {p: size for p, (size, _) in after.items()}
                if downloaded:
                    names = [relative, *(r for r, n in pinned.items() if n)]
                    in_use = {mine._target(x) for r in names for x in (r, *index_of(r))}
                    if usage.total > limit:
                        assert set(mine_known) <= in_use
                    evicted = [used[p] for p in before if p not in after]
                    kept = [used[p] for p in mine_known if p in used and p not in in_use]
                    assert max(evicted, default=0) <= min(kept, default=float("inf"))
            clock.now += usage.rescan_seconds
            usage.trim(keep="")
            assert usage.files() == {p: size for p, (size, _) in on_disk(cache).items()}
        finally:
            mine.close()
            other.close()
            fsspec.filesystem("memory").rm(root, recursive=True)


def test_a_download_no_longer_walks_the_cache(tmp_path, monkeypatch):
    """200 downloads under a generous limit: one walk of the folder (the first), and the
    ``stat`` calls per download do not grow with the files already cached (they did: each
    download walked and stat'ed the whole cache)."""
    root = remote_root("no-walk", [100] * 200)
    source = RemoteFiles(root, FAST, str(tmp_path), limit_bytes=1 << 30)
    calls = {"walk": 0, "stat": 0}
    walk, stat = os.walk, os.stat

    def counting_walk(*args, **kwargs):
        calls["walk"] += 1
        return walk(*args, **kwargs)

    def counting_stat(*args, **kwargs):
        calls["stat"] += 1
        return stat(*args, **kwargs)

    monkeypatch.setattr(os, "walk", counting_walk)
    monkeypatch.setattr(os, "stat", counting_stat)
    per_half = []
    try:
        for half in (range(100), range(100, 200)):
            start = calls["stat"]
            for i in half:
                source.local(f"data/f{i}.bin")
                source.release(f"data/f{i}.bin")
            per_half.append(calls["stat"] - start)
    finally:
        monkeypatch.undo()
        source.close()
        fsspec.filesystem("memory").rm(root, recursive=True)
    assert calls["walk"] == 1
    assert len(on_disk(tmp_path)) == 200
    # Walking per download costs 100 stats per download more in the second half.
    assert per_half[1] <= per_half[0] < 20 * 100


def test_the_limit_holds_when_another_process_fills_the_cache(tmp_path):
    """Files another process left (written straight into the folder) count as soon as this
    process rescans: after ``rescan_bytes`` of its own downloads, or after
    ``rescan_seconds``. Then the least recently used go, except one another process holds;
    until then the cache is over the limit by no more than those unseen files."""
    root = remote_root("filled", [1000] * 6)
    folder = tmp_path / "other-root"
    for case, (rescan_bytes, wait) in enumerate([(2000, 0.0), (1 << 40, 60.0)]):
        cache = str(tmp_path / f"cache{case}")
        clock = Clock()
        source = RemoteFiles(root, FAST, cache, 5000, rescan_bytes=rescan_bytes)
        source.usage.clock = clock
        source.local("data/f0.bin")  # the first trim scans: the cache is empty
        source.release("data/f0.bin")
        used_at(source._target("data/f0.bin"), 1000)
        folder = os.path.join(cache, "other-root")
        others = [os.path.join(folder, f"o{i}.bin") for i in range(8)]
        for i, path in enumerate(others):  # 8000 bytes, used at times 1001..1008
            write_as_another_process(path, 1000, mtime=1001 + i)
        held = open(others[0], "rb")  # the other process still reads its oldest file
        fcntl.flock(held, fcntl.LOCK_SH)
        source.local("data/f1.bin")
        source.release("data/f1.bin")
        # Not rescanned yet: over the limit by exactly the other process's unseen files.
        assert total(on_disk(cache)) == 2000 + 8000
        clock.now += wait
        source.local("data/f2.bin")
        source.release("data/f2.bin")
        assert sorted(os.path.basename(p) for p in on_disk(cache)) == [
            "f1.bin",
            "f2.bin",
            "o0.bin",  # held: stays, though least recently used
            "o6.bin",
            "o7.bin",
        ]
        assert source.usage.total == total(on_disk(cache)) == 5000
        held.close()
        source.close()
    fsspec.filesystem("memory").rm(root, recursive=True)


def _reader(root, cache, worker, files, results):
    """One process of several sharing a cache: reads every file, some held across others."""
    source = RemoteFiles(root, FAST, cache, 4000, rescan_bytes=1500)
    held = source.local("data/f0.bin")  # pinned throughout
    good = True
    for i in range(files):
        relative = f"data/f{(i * (worker + 1)) % files}.bin"
        with open(source.local(relative), "rb") as handle:
            good &= handle.read() == bytes([int(relative[6:-4])]) * 500
        source.release(relative)
    with open(held, "rb") as handle:
        good &= handle.read() == bytes([0]) * 500
    source.close()
    results.put(good)


def test_processes_sharing_the_cache_keep_each_others_files_and_the_bound(tmp_path):
    """Three processes trimming one cache: each reads the right bytes (a file one of them
    holds is never removed), no partial file is left, and the cache ends within the stated
    bound: the limit plus, per process, ``rescan_bytes`` and its in-flight file."""
    files = 24
    root = remote_root("shared", [500] * files)
    cache = str(tmp_path)
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    workers = [
        context.Process(target=_reader, args=(root, cache, w, files, results)) for w in range(3)
    ]
    for process in workers:
        process.start()
    outcomes = [results.get(timeout=120) for _ in workers]
    for process in workers:
        process.join(timeout=60)
    fsspec.filesystem("memory").rm(root, recursive=True)
    assert outcomes == [True, True, True]
    assert all(process.exitcode == 0 for process in workers)
    names = [name for _, _, found in os.walk(cache) for name in found]
    assert not [name for name in names if name.endswith(PARTIAL_SUFFIX)]
    assert total(on_disk(cache)) <= 4000 + 3 * (1500 + 500)


def test_eviction_follows_what_other_processes_did_since_the_rescan(tmp_path):
    """Without a rescan: a file another process used since goes after one it did not, and
    files another process removed leave the total rather than push out files that fit."""
    root = remote_root("others", [1000] * 8)
    cache = str(tmp_path)
    source = RemoteFiles(root, FAST, cache, 4000, rescan_bytes=1 << 40)
    source.usage.clock = Clock()
    paths = []
    for i in range(4):
        source.local(f"data/f{i}.bin")
        source.release(f"data/f{i}.bin")
        paths.append(source._target(f"data/f{i}.bin"))
        used_at(paths[-1], 1000 + i)  # used in the order f0, f1, f2, f3
    source.usage.rescan()
    mark_used(paths[0])  # another process reads f0 again
    source.local("data/f4.bin")
    source.release("data/f4.bin")
    assert sorted(os.path.basename(p) for p in on_disk(cache)) == [
        "f0.bin",
        "f2.bin",
        "f3.bin",
        "f4.bin",
    ]
    os.remove(paths[2])  # another process's trim takes f2 and f3
    os.remove(paths[3])
    source.local("data/f5.bin")
    source.release("data/f5.bin")
    source.local("data/f6.bin")
    source.release("data/f6.bin")
    assert sorted(os.path.basename(p) for p in on_disk(cache)) == [
        "f0.bin",
        "f4.bin",
        "f5.bin",
        "f6.bin",
    ]
    assert source.usage.total == total(on_disk(cache)) == 4000
    assert source.usage.rescans == 2
    source.close()
    fsspec.filesystem("memory").rm(root, recursive=True)


def test_a_prefetched_file_outlives_its_own_trim(tmp_path):
    root = remote_root("prefetched", [1000] * 2)
    source = RemoteFiles(root, FAST, str(tmp_path), 500)
    source.prefetch("data/f1.bin")
    source._pending["data/f1.bin"].result(timeout=30)
    assert [os.path.basename(p) for p in on_disk(tmp_path)] == ["f1.bin"]
    source.close()
    fsspec.filesystem("memory").rm(root, recursive=True)


def test_a_file_replaced_while_evicting_it_stays(tmp_path, monkeypatch):
    """Another process downloads (and may read) a fresh copy under the name while the
    eviction waits for its lock: the fresh copy is not removed."""
    path = str(tmp_path / "f.bin")
    write_as_another_process(path, 10)
    flock = fcntl.flock

    class Racing:
        LOCK_EX, LOCK_NB = fcntl.LOCK_EX, fcntl.LOCK_NB

        @staticmethod
        def flock(fd, operation):
            write_as_another_process(path, 20)  # the fresh copy lands first
            return flock(fd, operation)

    monkeypatch.setattr(usage_module, "fcntl", Racing)
    assert not remove_unless_held(path)
    assert os.path.getsize(path) == 20


def test_a_use_never_changes_a_cached_file_another_process_maps(tmp_path):
    """Issue 44: a pin (and its release) by one process recorded the use on the file's own
    mtime, and a reader in another process mapping the same inode read that as the shard
    rewritten under it. Uses go to the lock file now; the file keeps its stamp."""
    root = remote_root("mapped", [1000] * 2)
    cache = str(tmp_path)
    mine = RemoteFiles(root, FAST, cache, 1 << 20)
    other = RemoteFiles(root, FAST, cache, 1 << 20)
    path = mine.local("data/f0.bin")
    os.utime(path, (1000, 1000))  # fetched long ago: a warm cache
    stamp = os.stat(path)
    mapped = MappedFile(path)
    for _ in range(3):
        other.local("data/f0.bin")
        other.local("data/f1.bin")  # a download, and the trim after it
        other.release("data/f0.bin")
        other.release("data/f1.bin")
    mine.local("data/f0.bin")
    mine.release("data/f0.bin")
    mapped.check_unchanged()
    now = os.stat(path)
    assert (now.st_ino, now.st_size, now.st_mtime_ns) == (
        stamp.st_ino,
        stamp.st_size,
        stamp.st_mtime_ns,
    )
    assert use_stamp(path)[1] > 1000 * 10**9  # the uses were recorded, on the lock file
    mapped.close()
    mine.close()
    other.close()
    fsspec.filesystem("memory").rm(root, recursive=True)


class CountingFiles(RemoteFiles):
    """A cache that appends each file it downloads to ``log`` (shared by processes)."""

    log = ""

    def _download(self, relative, target):
        super()._download(relative, target)
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, (relative + "\n").encode())
        finally:
            os.close(fd)


def _fetch_all(root, cache, log, worker, files, start, results):
    """One process of several reading every file of a root in its own order, with every
    file hinted to its prefetch threads first."""
    CountingFiles.log = log
    source = CountingFiles(root, FAST, cache, 1 << 30)
    order = [(i * (2 * worker + 1)) % files for i in range(files)]
    start.wait()
    for i in order:
        source.prefetch(f"data/f{i}.bin")
    good = True
    for i in order:
        with open(source.local(f"data/f{i}.bin"), "rb") as handle:
            good &= handle.read() == bytes([i]) * 300
        source.release(f"data/f{i}.bin")
    source.close()
    results.put(good)


def test_each_file_is_fetched_once_per_cache_folder(tmp_path):
    """Four processes, each with its prefetch threads, read the same 16 files at once into
    one cache folder (room for all): every file is downloaded exactly once."""
    files = 16
    root = remote_root("once", [300] * files)
    log = str(tmp_path / "downloads.log")
    cache = str(tmp_path / "cache")
    context = multiprocessing.get_context("fork")
    results, start = context.Queue(), context.Barrier(4)
    readers = [
        context.Process(target=_fetch_all, args=(root, cache, log, w, files, start, results))
        for w in range(4)
    ]
    for process in readers:
        process.start()
    outcomes = [results.get(timeout=120) for _ in readers]
    for process in readers:
        process.join(timeout=60)
    fsspec.filesystem("memory").rm(root, recursive=True)
    assert outcomes == [True] * 4
    with open(log) as lines:
        downloads = collections.Counter(line.strip() for line in lines)
    assert downloads == {f"data/f{i}.bin": 1 for i in range(files)}


def test_a_stale_partial_stays_while_its_download_runs(tmp_path):
    """A partial left an hour is removed by a rescan, but not while a download holds the
    file's lock (one stalled in retries, which goes on writing to it)."""
    target = str(tmp_path / "root" / "f.bin")
    partial = partial_path(target, ObjectInfo(100))
    os.makedirs(os.path.dirname(target))
    with open(partial, "wb") as out:
        out.write(b"x" * 40)
    os.utime(partial, (1000, 1000))
    usage = CacheUsage(str(tmp_path), 1 << 20, 1 << 20)
    with open(target + LOCK_SUFFIX, "a") as download:
        fcntl.flock(download, fcntl.LOCK_EX)
        usage.rescan()
        assert os.path.exists(partial)
    usage.rescan()
    assert not os.path.exists(partial)
