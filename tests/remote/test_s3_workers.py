"""Issue 44: DataLoader workers, and ranks of one machine sharing a cache folder, read an
s3:// root (a moto server on loopback) through the remote cache.

Each run is compared token for token with the same config over a local copy of the root,
with a fresh cache and again with the cache it left (warm), with a cache limit that holds
every file and with one so small that files are evicted while the loader reads. What the
server saw is counted at a proxy in front of it: each file is fetched once per cache
folder, and again only after an eviction removed it (evictions are logged as the cache
makes them, ``cache_events``). The code before the fix stopped every multi-worker run with
"changed while being read": a use of a cached file by one worker touched its mtime, which
another worker mapping it read as the shard rewritten under it.
"""

import collections
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from cache_events import evicted, logging_removal
from s3local import upload_tree
from support import assert_same_batches, base_config, corpus, take

from fmsdata import build_dataloader
from fmsdata.data.indexing import index_root
from fmsdata.handlers import ArrowDocHandler
from fmsdata.remote import usage

pytestmark = pytest.mark.remote

# Per dataset; about 8 KB and 900 tokens each, read ten times in 300 batches. Cut into 4
# fragments each and dealt to the 4 logical shards in runs of 7, files 1, 3 and 5 are read
# by two shards: by two workers or two ranks, whatever the split.
FILES = 7
BATCHES = 300
# About five files: with each worker keeping at most OPEN_FILES open (and so pinned),
# the cache is full from the first epoch on and evicts while readers read.
SMALL_CACHE_BYTES = 40_000
OPEN_FILES = 3
HERE = pathlib.Path(__file__).parent


@pytest.fixture
def root(tmp_path, s3, bucket):
    """14 Arrow files in 2 datasets with ``meta/counts.csv``, local and under ``data/``."""
    info = corpus(tmp_path / "local", {"a": FILES, "b": FILES})
    index_root(info.root, ArrowDocHandler())
    upload_tree(s3.client(), bucket, info.root, "data")
    return info


@pytest.fixture
def server(proxy):
    """A proxy in front of the S3 server that counts the GETs of each object."""
    return proxy()


@pytest.fixture
def eviction_log(tmp_path, monkeypatch):
    log = str(tmp_path / "evictions.log")
    monkeypatch.setattr(usage, "remove_unless_held", logging_removal(log))
    return log


def local_config(info, workers, small):
    config = base_config(
        info,
        seq_length=128,
        batch_size=4,
        logical_shards=4,
        shuffle_window=4,
        file_type="arrow",
        num_workers=workers,
    )
    if small:
        config["open_files"] = OPEN_FILES
    return config


def remote_config(config, bucket, server, cache_dir, small):
    remote = {
        **config,
        "data_path": f"s3://{bucket}/data",
        "endpoint_url": server.url,
        "cache_dir": str(cache_dir),
        "remote_backoff": 0.01,
    }
    if small:
        remote["remote_cache_gb"] = SMALL_CACHE_BYTES / (1 << 30)
    return remote


def shard_files(info):
    return {f"{name}/shard_{i:05d}.arrow" for name in info.ranges for i in range(FILES)}


def fetched(server, bucket):
    """GETs of each shard file at the server, by root-relative path (then forgotten)."""
    prefix = f"/{bucket}/data/"
    gets = collections.Counter(
        {p.removeprefix(prefix): n for p, n in server.gets.items() if p.endswith(".arrow")}
    )
    server.gets.clear()
    return gets


def check_fetches(gets, removed, present, files, small):
    """Each file fetched once per cache folder: only if absent when the run began, and once
    more per eviction of it. Under the small limit a run from an empty cache evicted (a
    warm one evicts only if it fetches: the cache is trimmed when a file comes in); under
    the roomy one nothing was evicted and every absent file came exactly once."""
    assert set(gets) <= files
    for name, n in gets.items():
        assert n <= (name not in present) + removed[name], (name, n, removed[name], present)
    if small:
        if not present:
            assert sum(removed.values()) > 0
            assert sum(gets.values()) > len(files)  # fetched again after evictions
    else:
        assert not removed
        assert gets == {name: 1 for name in files - present}


def stats(cache_dir):
    """(inode, size, mtime) of each complete cached file, by root-relative path."""
    base = os.path.join(cache_dir, "remote")
    found = {}
    for folder, _, names in os.walk(base):
        for name in names:
            if name.endswith(".arrow"):
                path = os.path.join(folder, name)
                relative = os.path.relpath(path, base).split(os.sep, 1)[1]
                stat = os.stat(path)
                found[relative.replace(os.sep, "/")] = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
    return found


def check_untouched(before, after, removed):
    """A cached file is never changed: one the run did not evict is the same inode with
    the size and mtime it had (one evicted may be a fresh copy, maybe on a reused inode)."""
    for name, stat in before.items():
        if not removed[name]:
            assert after.get(name) == stat, name


def run_fresh_and_warm(info, bucket, server, log, tmp_path, workers, small, batches):
    config = local_config(info, workers, small)
    reference = take(build_dataloader(config), batches)
    assert len(reference) == batches
    cache_dir = tmp_path / "cache"
    remote = remote_config(config, bucket, server, cache_dir, small)
    fetched(server, bucket)
    for _ in ("fresh", "warm"):
        cached = stats(cache_dir)
        before = evicted(log, str(cache_dir))
        assert_same_batches(reference, take(build_dataloader(remote), batches))
        removed = evicted(log, str(cache_dir)) - before
        check_fetches(fetched(server, bucket), removed, set(cached), shard_files(info), small)
        check_untouched(cached, stats(cache_dir), removed)
    return set(cached)


def test_two_workers_read_the_local_batches_and_fetch_each_file_once(
    root, bucket, server, eviction_log, tmp_path
):
    """The quick case of the default suite: two workers, a fresh cache then a warm one."""
    present = run_fresh_and_warm(root, bucket, server, eviction_log, tmp_path, 2, False, 120)
    assert present == shard_files(root)  # the warm run began with every file cached


@pytest.mark.slow  # 6 loaders of 2 or 4 workers, 300 batches each
@pytest.mark.parametrize("small", [False, True], ids=["roomy", "evicting"])
@pytest.mark.parametrize("workers", [2, 4])
def test_workers_read_the_local_batches_through_one_cache(
    root, bucket, server, eviction_log, tmp_path, workers, small
):
    run_fresh_and_warm(root, bucket, server, eviction_log, tmp_path, workers, small, BATCHES)


RANK = """
import json, sys, torch
sys.path[:0] = sys.argv[1:3]
from cache_events import logging_removal
from support import take
from fmsdata import build_dataloader
from fmsdata.remote import usage
config, rank, log, out = json.loads(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
usage.remove_unless_held = logging_removal(log)
torch.save(take(build_dataloader(config, rank=rank, world_size=2), int(sys.argv[7])), out)
"""


def run_ranks(config, log, out, batches):
    """Two rank processes at once (each with its config's workers); their batches."""
    paths = [os.path.join(out, f"rank{rank}.pt") for rank in range(2)]
    errors = [os.path.join(out, f"rank{rank}.err") for rank in range(2)]
    ranks = []
    for rank in range(2):
        with open(errors[rank], "w") as err:  # a file: a full pipe would stall the rank
            args = [str(HERE.parent), str(HERE), json.dumps(config), str(rank), log]
            command = [sys.executable, "-c", RANK, *args, paths[rank], str(batches)]
            ranks.append(subprocess.Popen(command, stderr=err))
    for rank, process in enumerate(ranks):
        process.wait(timeout=300)
        with open(errors[rank]) as err:
            assert process.returncode == 0, err.read()[-3000:]
    return [torch.load(path, weights_only=True) for path in paths]


@pytest.mark.slow  # 2 ranks of 2 workers each, as processes, fresh and warm, 300 batches
@pytest.mark.parametrize("small", [False, True], ids=["roomy", "evicting"])
def test_two_ranks_sharing_a_cache_folder_read_the_local_batches(
    root, bucket, server, tmp_path, small
):
    config = local_config(root, 2, small)
    reference = [
        take(build_dataloader(config, rank=rank, world_size=2), BATCHES) for rank in range(2)
    ]
    cache_dir = tmp_path / "cache"
    remote = remote_config(config, bucket, server, cache_dir, small)
    log = str(tmp_path / "evictions.log")
    fetched(server, bucket)
    for run in ("fresh", "warm"):
        cached = stats(cache_dir)
        before = evicted(log, str(cache_dir))
        out = tmp_path / run
        out.mkdir()
        got = run_ranks(remote, log, str(out), BATCHES)
        for rank in range(2):
            assert_same_batches(reference[rank], got[rank])
        removed = evicted(log, str(cache_dir)) - before
        check_fetches(fetched(server, bucket), removed, set(cached), shard_files(root), small)
        check_untouched(cached, stats(cache_dir), removed)
