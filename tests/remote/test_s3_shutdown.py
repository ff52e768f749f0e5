"""A dropped loader's DataLoader workers stop on torch's stop message, never by its 5 s
join timeout and a SIGTERM — also when the garbage collector frees the loader out of a
reference cycle (over S3, a missing object's error raised through fsspec made one, which
held the frame of ``build_dataloader`` and so the loader)."""

import gc
import multiprocessing.process
import weakref

import pytest
import torch.utils.data._utils as torch_data_utils
from support import base_config, take

from fmsdata import build_dataloader

# S3 through DataLoader workers, end to end (as test_s3_loader's): run with -m slow.
pytestmark = [pytest.mark.remote, pytest.mark.slow]


@pytest.fixture
def config(data, tmp_path, s3, bucket):
    return {
        **base_config(data, num_workers=1),
        "data_path": f"s3://{bucket}/root",
        "endpoint_url": s3.url,
        "cache_dir": str(tmp_path / "cache"),
        "remote_backoff": 0.01,
    }


@pytest.fixture
def terminated(monkeypatch):
    """Processes torch had to terminate, with its real join timeout (tests/conftest.py
    shortens it): a worker that never receives the stop message is joined for 5 s, then
    terminated."""
    monkeypatch.setattr(torch_data_utils, "MP_STATUS_CHECK_INTERVAL", 5.0)
    calls = []
    terminate = multiprocessing.process.BaseProcess.terminate

    def spy(process):
        calls.append(process.pid)
        terminate(process)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "terminate", spy)
    return calls


@pytest.mark.parametrize("in_a_cycle", [False, True], ids=["dropped", "dropped-in-a-cycle"])
def test_a_dropped_s3_loader_stops_its_workers_without_the_join_timeout(
    config, terminated, in_a_cycle
):
    loader = build_dataloader(config)
    iterator = iter(loader)
    take(iterator, 3)
    pids = loader.worker_pids()
    assert len(pids) == 1
    if in_a_cycle:  # as any traceback kept in user code holding the loop's frame does
        cycle: list = [loader, iterator]
        cycle.append(cycle)
        del cycle
    del iterator, loader
    gc.collect()
    assert terminated == [], "a worker missed the stop message and was terminated"


def test_a_dropped_s3_loader_is_freed_without_the_garbage_collector(config):
    """Its root has no metadata.json: the error fsspec raised for it, in a reference
    cycle, kept the frames that built the loader (and so the loader) until a collection."""
    gc.disable()  # a collection in between would free it either way
    try:
        loader = build_dataloader(config)
        iterator = iter(loader)
        take(iterator, 2)
        ref = weakref.ref(loader)
        del iterator, loader
        assert ref() is None
    finally:
        gc.enable()
