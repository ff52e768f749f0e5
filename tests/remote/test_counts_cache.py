"""The counts a remote root's metadata gave are kept on disk per root (issue 27): a second
process reads no footer, a file rewritten in place (another size or ETag) is counted
again, a damaged cache is ignored; long listings report progress ``(done, total)``.

Counts, never times: the files whose metadata is read are recorded.
"""

import collections
import pathlib

import pytest
from s3local import upload_tree
from support import base_config, corpus

from fmsdata import build_dataloader
from fmsdata.data import filecounts, indexing, metacount
from fmsdata.data.catalog import discover
from fmsdata.data.indexing import index_root
from fmsdata.handlers import ArrowDocHandler
from fmsdata.remote.storage import Storage

pytestmark = pytest.mark.remote

FILES = 6  # per dataset


@pytest.fixture
def root(tmp_path, s3, bucket):
    info = corpus(tmp_path / "data", {"a": FILES, "b": FILES}, docs_per_file=20)
    upload_tree(s3.client(), bucket, info.root, "bare")
    return info


@pytest.fixture
def footers(monkeypatch):
    """Every file whose metadata is read, by path under the root."""
    read: collections.Counter[str] = collections.Counter()
    count_files = metacount.count_files

    def counted(base, relatives, *args, **kwargs):
        read.update(relatives)
        return count_files(base, relatives, *args, **kwargs)

    monkeypatch.setattr(metacount, "count_files", counted)
    monkeypatch.setattr(indexing, "count_files", counted)
    filecounts.forget_all()
    yield read
    filecounts.forget_all()


def _discover(s3, bucket, counts_dir, progress=None):
    filecounts.forget_all()  # as in a new process
    storage = Storage(endpoint_url=s3.url)
    return discover(
        f"s3://{bucket}/bare", None, ArrowDocHandler(), storage, progress, str(counts_dir)
    )


def test_a_second_process_reads_no_footer(root, s3, bucket, tmp_path, footers):
    first = _discover(s3, bucket, tmp_path / "counts")
    assert len(footers) == 2 * FILES
    footers.clear()
    second = _discover(s3, bucket, tmp_path / "counts")
    assert not footers
    for a, b in zip(first.datasets, second.datasets):
        assert a.docs.tolist() == b.docs.tolist() == [20] * FILES


def test_a_rewritten_file_is_counted_again(root, s3, bucket, tmp_path, footers):
    _discover(s3, bucket, tmp_path / "counts")
    footers.clear()
    client = s3.client()
    key = "bare/a/" + sorted(p.name for p in pathlib.Path(root.root, "a").iterdir())[0]
    other = sorted(pathlib.Path(root.root, "b").iterdir())[0].read_bytes()  # another ETag
    client.put_object(Bucket=bucket, Key=key, Body=other)
    catalog = _discover(s3, bucket, tmp_path / "counts")
    assert list(footers) == [key.removeprefix("bare/")]
    assert catalog.datasets[0].docs.tolist() == [20] * FILES


def test_a_damaged_cache_is_ignored(root, s3, bucket, tmp_path, footers):
    _discover(s3, bucket, tmp_path / "counts")
    path = filecounts.disk_path(str(tmp_path / "counts"), f"s3://{bucket}/bare")
    with open(path, "a") as out:
        out.write("a/part.arrow\tnot a size\n")
    footers.clear()
    catalog = _discover(s3, bucket, tmp_path / "counts")
    assert len(footers) == 2 * FILES  # counted again, and the cache written anew
    assert [ds.docs.tolist() for ds in catalog.datasets] == [[20] * FILES] * 2
    footers.clear()
    _discover(s3, bucket, tmp_path / "counts")
    assert not footers


def test_a_loader_start_uses_the_cache_of_its_cache_dir(root, s3, bucket, tmp_path, footers):
    config = {
        **base_config(root),
        "data_path": f"s3://{bucket}/bare",
        "endpoint_url": s3.url,
        "cache_dir": str(tmp_path / "cache"),
    }
    first = next(iter(build_dataloader(config)))
    assert len(footers) == 2 * FILES
    footers.clear()
    filecounts.forget_all()
    second = next(iter(build_dataloader(config)))
    assert not footers
    assert (first["input_ids"] == second["input_ids"]).all()


def test_long_listings_report_progress(root, s3, bucket, tmp_path, footers):
    seen = []
    _discover(s3, bucket, tmp_path / "counts", progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (2 * FILES, 2 * FILES) and len(seen) == 2 * FILES
    indexed = []
    index_root(
        f"s3://{bucket}/bare",
        ArrowDocHandler(),
        storage=Storage(endpoint_url=s3.url),
        cache_dir=str(tmp_path / "c"),
        progress=lambda d, t: indexed.append((d, t)),
    )
    assert indexed == [(i + 1, 2 * FILES) for i in range(2 * FILES)]
    assert sum(footers.values()) == 4 * FILES  # discover's and the index's: one read each
