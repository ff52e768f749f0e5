"""Two DataLoader workers over an S3 root (issue 46): a dropped loader stops both at once,
and a file two processes read from one cache folder stays readable to both.

Counts, never times: with torch's join interval at 0.5 s (tests/conftest.py), a worker
that did not exit within 0.5 s of its stop message would be joined that long and then
terminated; a terminated worker fails the test.
"""

import gc
import multiprocessing.process
import os

import fsspec
import pytest
from s3local import upload_tree
from support import assert_same_batches, corpus, take

from fmsdata import build_dataloader
from fmsdata.data.indexing import index_root
from fmsdata.handlers import ArrowDocHandler
from fmsdata.handlers.mapping import MappedFile
from fmsdata.remote.cache import RemoteFiles
from fmsdata.remote.retry import RetryPolicy
from fmsdata.remote.storage import Storage

pytestmark = pytest.mark.remote


@pytest.fixture
def terminated(monkeypatch):
    calls = []
    terminate = multiprocessing.process.BaseProcess.terminate

    def spy(process):
        calls.append(process.pid)
        terminate(process)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "terminate", spy)
    return calls


def test_a_dropped_two_worker_s3_loader_stops_both_workers_at_once(
    tmp_path, s3, bucket, terminated
):
    # Two logical shards, two files per dataset: each worker reads files of its own (a
    # file read by two processes is the next test's).
    info = corpus(tmp_path / "data", {"a": 2, "b": 2}, docs_per_file=60)
    index_root(info.root, ArrowDocHandler())
    upload_tree(s3.client(), bucket, info.root, "root")
    local = dict(
        data_path=info.root,
        datasets=["a", "b"],
        weights=[1.0, 1.0],
        seq_length=32,
        batch_size=2,
        logical_shards=2,
        eos_token=2,
        num_workers=2,
    )
    config = {
        **local,
        "data_path": f"s3://{bucket}/root",
        "endpoint_url": s3.url,
        "cache_dir": str(tmp_path / "cache"),
        "remote_backoff": 0.01,
    }
    for dropped_in_a_cycle in (False, True):
        loader = build_dataloader(config)
        iterator = iter(loader)
        assert_same_batches(take(build_dataloader(local), 3), take(iterator, 3))
        pids = loader.worker_pids()
        assert len(pids) == 2
        if dropped_in_a_cycle:
            cycle: list = [loader, iterator]
            cycle.append(cycle)
            del cycle
        del iterator, loader
        gc.collect()
        assert terminated == [], "a worker was still running 0.5 s after its stop message"
        for pid in pids:
            with pytest.raises(ChildProcessError):  # exited and reaped
                os.waitpid(pid, os.WNOHANG)


def test_a_cached_file_pinned_by_another_process_stays_readable(tmp_path):
    fs = fsspec.filesystem("memory")
    root = "memory://pinned"
    fs.pipe(f"{root}/data/f0.bin", bytes(range(200)) * 10)
    storage = Storage(retry=RetryPolicy(tries=2, backoff=0.0))
    mine = RemoteFiles(root, storage, str(tmp_path), 1 << 20)
    other = RemoteFiles(root, storage, str(tmp_path), 1 << 20)  # another worker's
    try:
        mapped = MappedFile(mine.local("data/f0.bin"))
        os.utime(mapped.path, ns=(1, 1))  # (a clock tick between the two pins)
        mapped = MappedFile(mapped.path)
        other.local("data/f0.bin")
        mapped.check_unchanged()
    finally:
        mine.close()
        other.close()
        fs.rm(root, recursive=True)
