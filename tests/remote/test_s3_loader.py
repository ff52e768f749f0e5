"""S6: a data root in S3 (a moto server on loopback, over HTTP) gives exactly the batches
of the same data on local disk, resumes exactly, and survives transient failures."""

import logging

import pytest
import torch
from support import assert_same_batches, base_config, take

from fmsdata import build_dataloader
from fmsdata.errors import RemoteIOError
from fmsdata.remote.cache import RemoteFiles
from fmsdata.remote.retry import RetryPolicy
from fmsdata.remote.storage import Storage

pytestmark = pytest.mark.remote


def remote(config, url, endpoint, tmp_path, **overrides):
    return {
        **config,
        "data_path": url,
        "endpoint_url": endpoint,
        "cache_dir": str(tmp_path / "cache"),
        "remote_backoff": 0.01,
        **overrides,
    }


@pytest.mark.slow  # S3 through DataLoader workers, end to end
def test_s3_root_gives_the_local_batches_and_resumes_exactly(data, s3, bucket, tmp_path):
    local = base_config(data, num_workers=1)
    config = remote(local, f"s3://{bucket}/root", s3.url, tmp_path)
    reference = take(build_dataloader(local), 20)
    assert_same_batches(reference, take(build_dataloader(config), 20))

    first = build_dataloader(config)
    take(first, 8)  # mid-epoch: the corpus holds many more lines
    state = first.state_dict()
    resumed = build_dataloader(config)
    resumed.load_state_dict(state)
    assert_same_batches(reference[8:], take(resumed, 12))
    # The data moved to local disk: the state saved over S3 continues there exactly.
    moved = build_dataloader(local)
    moved.load_state_dict(state)
    assert_same_batches(reference[8:], take(moved, 12))


@pytest.mark.slow  # S3 through DataLoader workers, end to end
def test_transient_failures_are_retried_and_change_nothing(data, s3, bucket, proxy, tmp_path):
    local = base_config(data, num_workers=1)
    reference = take(build_dataloader(local), 15)
    flaky = proxy("500", "503", "drop", "cut", every=3)
    config = remote(local, f"s3://{bucket}/root", flaky.url, tmp_path)
    assert_same_batches(reference, take(build_dataloader(config), 15))
    assert set(flaky.injected) == {"500", "503", "drop", "cut"}


def test_a_missing_object_fails_at_once_naming_the_url(data, s3, bucket, proxy, tmp_path):
    counting = proxy()
    storage = Storage(endpoint_url=counting.url, retry=RetryPolicy(tries=6, backoff=0.01))
    source = RemoteFiles(f"s3://{bucket}/root", storage, str(tmp_path), 1 << 30)
    with pytest.raises(FileNotFoundError, match=f"s3://{bucket}/root/a/nope.arrow"):
        source.local("a/nope.arrow")
    assert counting.requests <= 2  # a HEAD (and a listing fallback), never retried
    source.close()


def test_a_failure_that_persists_is_a_remote_io_error(data, s3, bucket, proxy, tmp_path):
    down = proxy()
    config = remote(
        base_config(data, num_workers=1),
        f"s3://{bucket}/root",
        down.url,
        tmp_path,
        remote_retries=3,
    )
    loader = build_dataloader(config)
    assert loader.fingerprint  # the root is listed while the server answers
    down.fail_all = True
    with pytest.raises(RemoteIOError, match=rf"s3://{bucket}/root/.* failed after 3 tries"):
        take(loader, 1)


def test_credentials_are_never_logged_or_saved(data, s3, bucket, tmp_path, caplog, monkeypatch):
    secret = "s3cr3t-never-in-a-state"
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    config = remote(
        base_config(data, num_workers=0),
        f"s3://{bucket}/root",
        s3.url,
        tmp_path,
        storage_options={"key": "testing", "secret": secret},
    )
    caplog.set_level(logging.DEBUG, logger="fmsdata")
    loader = build_dataloader(config)
    take(loader, 3)
    state = loader.state_dict()
    raw = b"".join(t.numpy().tobytes() for t in state.values() if isinstance(t, torch.Tensor))
    assert raw and secret.encode() not in raw
    assert secret not in caplog.text
    assert secret not in repr(loader.config)


def test_every_stream_asks_for_its_first_file_before_any_is_read(
    data, s3, bucket, tmp_path, monkeypatch
):
    """Start-up downloads overlap: all logical shards' streams hint their first file to the
    cache before the first one is opened, not one after another as lines are dealt."""
    events = []
    prefetch, local = RemoteFiles.prefetch, RemoteFiles.local
    monkeypatch.setattr(
        RemoteFiles, "prefetch", lambda self, rel: (events.append("hint"), prefetch(self, rel))
    )
    monkeypatch.setattr(
        RemoteFiles, "local", lambda self, rel: (events.append("open"), local(self, rel))[1]
    )
    shards = 4
    config = remote(
        base_config(data, num_workers=0, batch_size=1, logical_shards=shards),
        f"s3://{bucket}/root",
        s3.url,
        tmp_path,
    )
    take(build_dataloader(config), 1)
    streams = shards * 2  # datasets a and b
    assert events.index("open") >= streams, events
