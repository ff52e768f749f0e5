"""Issue 46: odd files on an S3 root without ``meta/counts.csv``. Whether a file holds a
kept document is read from its first batch headers by range request, so the start pulls
no more files than the same root with counts; the odd file, pulled to be searched, is the
one exception. The batches are those of the same data on local disk."""

import collections

import pytest
from oddfiles import loader_config, write_layout
from s3local import upload_tree
from support import assert_same_batches, take

from fmsdata import build_dataloader
from fmsdata.data import filecounts
from fmsdata.data.indexing import index_root
from fmsdata.handlers import ArrowDocHandler
from fmsdata.remote.cache import RemoteFiles

pytestmark = pytest.mark.remote


@pytest.fixture
def pulls(monkeypatch):
    pulled: collections.Counter[str] = collections.Counter()
    download = RemoteFiles._download

    def counted(self, relative, target):
        pulled[relative] += 1
        return download(self, relative, target)

    monkeypatch.setattr(RemoteFiles, "_download", counted)
    filecounts.forget_all()
    yield pulled
    filecounts.forget_all()


def test_odd_files_over_s3_pull_only_what_they_read(tmp_path, s3, bucket, pulls):
    # 12 files of long documents, one empty, one of short documents only.
    files = [[40] * 6 for _ in range(12)]
    files[3] = []
    files[8] = [2, 1, 3]
    layout = write_layout(str(tmp_path / "data"), files)
    upload_tree(s3.client(), bucket, layout.root, "bare")
    index_root(layout.root, ArrowDocHandler())
    upload_tree(s3.client(), bucket, layout.root, "counted")
    local = loader_config(layout, 2, datasets=["ds"], weights=[1.0])
    reference = take(build_dataloader(local), 4)

    def first_pulls(prefix):
        filecounts.forget_all()
        pulls.clear()
        config = {
            **local,
            "data_path": f"s3://{bucket}/{prefix}",
            "endpoint_url": s3.url,
            "cache_dir": str(tmp_path / f"cache-{prefix}"),
            "remote_backoff": 0.01,
        }
        batches = take(build_dataloader(config), 4)
        assert_same_batches(reference, batches)
        return set(pulls)

    counted = first_pulls("counted")
    bare = first_pulls("bare")
    assert bare - counted <= {"ds/f08.arrow"}, sorted(bare - counted)
    assert len(bare) < len(files) - 2, sorted(bare)
