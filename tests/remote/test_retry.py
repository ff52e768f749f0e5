"""Every failed try of a remote call is a warning naming URL, try, cause and next wait."""

import logging

import pytest
from s3local import free_port

from fmsdata import build_dataloader
from fmsdata.errors import RemoteIOError
from fmsdata.remote.retry import RetryPolicy, retrying


def test_each_retry_is_a_warning(caplog):
    failures = [ConnectionResetError("reset by peer"), TimeoutError("timed out")]

    def flaky():
        if failures:
            raise failures.pop(0)
        return "done"

    with caplog.at_level(logging.WARNING, logger="fmsdata.remote.retry"):
        assert retrying(RetryPolicy(tries=5, backoff=0.0), "s3://b/k", flaky) == "done"
    assert [r.getMessage() for r in caplog.records] == [
        "read s3://b/k failed (try 1 of 5): ConnectionResetError: reset by peer; retrying in 0.0s",
        "read s3://b/k failed (try 2 of 5): TimeoutError: timed out; retrying in 0.0s",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_an_unreachable_anonymous_endpoint_is_not_silent(caplog, tmp_path):
    config = dict(
        data_path="s3://bucket/root",
        endpoint_url=f"http://127.0.0.1:{free_port()}",  # nothing listens there
        anonymous=True,
        remote_retries=3,
        remote_backoff=0.0,
        seq_length=8,
        batch_size=1,
        logical_shards=1,
        num_workers=0,
        cache_dir=str(tmp_path),
    )
    with caplog.at_level(logging.WARNING), pytest.raises(RemoteIOError, match="after 3 tries"):
        next(iter(build_dataloader(config)))
    warned = [r.getMessage() for r in caplog.records if r.name == "fmsdata.remote.retry"]
    assert len(warned) >= 2
    assert "s3://bucket/root" in warned[0] and "(try 1 of 3)" in warned[0]
    assert "(try 2 of 3)" in warned[1] and "retrying in" in warned[1]
