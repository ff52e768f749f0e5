"""Issue 27: a start or a resume over S3 pulls the files its streams read, never the root.

Counts, never times: every whole-file download of the cache is recorded, and a resume (or
a start on a root without ``meta/counts.csv``) may pull at most 1.5x what a fresh start
with counts pulls, plus 10 — the figure the issue asks of a 2,000-file root, here on a
root small enough for a test and with many logical shards. Today's code downloaded every
file in both cases (a resume measured every file of a small dataset; a root without
counts was counted by downloading it).
"""

import collections
import os
import pathlib

import pytest
from s3local import upload_tree
from support import assert_same_batches, base_config, corpus, take

from fmsdata import build_dataloader
from fmsdata.data import filecounts
from fmsdata.data.catalog import discover
from fmsdata.data.indexing import index_root
from fmsdata.handlers import ArrowDocHandler
from fmsdata.remote.cache import RemoteFiles
from fmsdata.remote.storage import Storage
from fmsdata.remote.usage import LOCK_SUFFIX

pytestmark = pytest.mark.remote

FILES = 32  # per dataset


@pytest.fixture
def roots(tmp_path, s3, bucket):
    """The same corpus twice in the bucket: with ``meta/counts.csv`` and without."""
    info = corpus(tmp_path / "data", {"a": FILES, "b": FILES}, docs_per_file=160)
    upload_tree(s3.client(), bucket, info.root, "bare")
    index_root(info.root, ArrowDocHandler())
    upload_tree(s3.client(), bucket, info.root, "counted")
    return info


@pytest.fixture
def pulls(monkeypatch):
    """Every whole file the remote cache downloads, by root-relative path."""
    pulled: collections.Counter[str] = collections.Counter()
    download = RemoteFiles._download

    def counted(self, relative, target):
        pulled[relative] += 1
        return download(self, relative, target)

    monkeypatch.setattr(RemoteFiles, "_download", counted)
    filecounts.forget_all()  # each start below is a fresh process
    yield pulled
    filecounts.forget_all()


def _config(info, s3, bucket, tmp_path, prefix, cache):
    return {
        **base_config(info, logical_shards=8, batch_size=4, shuffle_window=8),
        "data_path": f"s3://{bucket}/{prefix}",
        "endpoint_url": s3.url,
        "cache_dir": str(tmp_path / cache),
        "remote_backoff": 0.01,
    }


def _first_batch_pulls(config, pulls, state=None):
    filecounts.forget_all()
    pulls.clear()
    loader = build_dataloader(config)
    if state is not None:
        loader.load_state_dict(state)
    batch = next(iter(loader))
    return set(pulls), batch


@pytest.mark.slow  # 2,000-file root over S3, a fresh start and a resume: ~30 s on 2 cores
def test_resume_pulls_what_a_fresh_start_pulls(roots, s3, bucket, tmp_path, pulls):
    config = _config(roots, s3, bucket, tmp_path, "counted", "cache-run")
    run = build_dataloader(config)
    head = take(run, 31)
    state = run.state_dict()

    fresh, _ = _first_batch_pulls({**config, "cache_dir": str(tmp_path / "c1")}, pulls)
    resumed, batch = _first_batch_pulls({**config, "cache_dir": str(tmp_path / "c2")}, pulls, state)
    assert 0 < len(fresh) < 2 * FILES
    assert len(resumed) <= 1.5 * len(fresh) + 10, (len(resumed), len(fresh))
    assert max(pulls.values()) == 1  # no file pulled twice
    # ... and the resume is still exact.
    reference = take(build_dataloader({**config, "cache_dir": str(tmp_path / "c3")}), 32)
    assert_same_batches(reference[:31], head)
    assert_same_batches(reference[31:], [batch])


@pytest.mark.slow  # 2,000 footers read over S3: ~30 s on 2 cores
def test_root_without_counts_is_counted_without_pulling_it(roots, s3, bucket, tmp_path, pulls):
    counted = _config(roots, s3, bucket, tmp_path, "counted", "c1")
    bare = _config(roots, s3, bucket, tmp_path, "bare", "c2")
    with_counts, reference = _first_batch_pulls(counted, pulls)
    without, batch = _first_batch_pulls(bare, pulls)
    assert len(without) <= 1.5 * len(with_counts) + 10, (len(without), len(with_counts))
    assert_same_batches([reference], [batch])


def test_metadata_counts_equal_the_counts_file(roots, s3, bucket):
    """Counts read with range requests (footers only) are the files' own counts."""
    filecounts.forget_all()
    storage = Storage(endpoint_url=s3.url)
    handler = ArrowDocHandler()
    bare = discover(f"s3://{bucket}/bare", None, handler, storage)
    local = discover(roots.root, None, handler)
    for remote_ds, local_ds in zip(bare.datasets, local.datasets):
        assert remote_ds.docs.tolist() == local_ds.docs.tolist()
        assert (remote_ds.docs == 160).all()
    filecounts.forget_all()


def test_index_of_an_s3_root_reads_no_shard_body(roots, s3, bucket, tmp_path, pulls):
    """``fmsdata index`` over S3 writes the same counts file as over local disk, from the
    files' metadata: no shard is downloaded."""
    storage = Storage(endpoint_url=s3.url)
    _, remote_rows = index_root(
        f"s3://{bucket}/bare", ArrowDocHandler(), storage=storage, cache_dir=str(tmp_path / "c")
    )
    _, local_rows = index_root(roots.root, ArrowDocHandler())
    assert sorted(remote_rows) == sorted(local_rows)
    assert not pulls


def _cache_bytes(folder):
    """Bytes of the complete files in the cache now. The loader's prefetch threads evict
    and add files while this walks, so a file listed and gone before its size is read
    counts as gone."""
    total = 0
    for d, _, names in os.walk(folder):
        for f in names:
            if f.endswith(LOCK_SUFFIX) or ".partial" in f:
                continue
            try:
                total += os.path.getsize(os.path.join(d, f))
            except FileNotFoundError:
                pass
    return total


def test_a_small_remote_cache_stays_bounded_through_a_resume(
    roots, s3, bucket, tmp_path, pulls, monkeypatch
):
    """remote_cache_gb holds during a start and a resume: after every batch the cache
    holds at most the limit, plus the files readers have pinned, plus the files the
    prefetch threads just fetched (kept until read); over the limit, readers close down to
    one file per stream (+16), which lets their files go; it evicts; batches stay exact."""
    sources = []
    init = RemoteFiles.__init__

    def recorded(self, *args, **kwargs):
        init(self, *args, **kwargs)
        sources.append(self)

    monkeypatch.setattr(RemoteFiles, "__init__", recorded)
    sizes = [os.path.getsize(p) for p in pathlib.Path(roots.root).rglob("*.arrow")]
    limit = 4 * max(sizes)
    config = {
        **_config(roots, s3, bucket, tmp_path, "counted", "cache-run"),
        "remote_cache_gb": limit / (1 << 30),
    }
    run = build_dataloader(config)
    head = take(run, 12)
    state = run.state_dict()
    reference = take(build_dataloader({**config, "remote_cache_gb": 100.0}), 24)
    assert_same_batches(reference[:12], head)
    cache = tmp_path / "cache-small"
    resumed = build_dataloader({**config, "cache_dir": str(cache)})
    resumed.load_state_dict(state)
    batches, most_pinned = iter(resumed), 0
    pulls.clear()
    for want in reference[12:]:
        assert_same_batches([want], [next(batches)])
        pinned = sum(
            os.path.getsize(source._target(name)) for source in sources for name in source._pins
        )
        held = _cache_bytes(cache)
        assert held <= limit + pinned + 4 * max(sizes), (held, limit, pinned)
        most_pinned = max(most_pinned, sum(len(source._pins) for source in sources))
    shards, datasets = config["logical_shards"], len(config["datasets"])
    assert most_pinned <= shards * datasets + 16  # the readers' floor, not 2 x that + 16
    pulled = sum(pulls.values())
    assert pulled > 2 * limit // max(sizes)  # more files went through than the limit holds
    assert _cache_bytes(cache) < sum(sizes)  # and some were evicted
