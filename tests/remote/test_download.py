"""S5 ``fmsdata download``: a tree of shards from S3 (moto on loopback) to local disk,
resumable, verified, parallel, and never writing outside DEST."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from s3local import upload_tree

from fmsdata.cli.main import main
from fmsdata.remote.mirror import MANIFEST
from fmsdata.remote.transfer import PARTIAL_SUFFIX

pytestmark = pytest.mark.remote


def tree(root, sizes):
    """Random files at nested keys; returns {key: bytes}."""
    rng = np.random.default_rng(len(sizes))
    files = {}
    for key, size in sizes.items():
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        path = os.path.join(root, *key.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as out:
            out.write(data)
        files[key] = data
    return files


def local_files(dest):
    out = {}
    for folder, _, names in os.walk(dest):
        for name in names:
            path = os.path.join(folder, name)
            out[os.path.relpath(path, dest).replace(os.sep, "/")] = open(path, "rb").read()
    out.pop(MANIFEST, None)
    return out


SIZES = {
    "web/part_000.arrow": 70_000,
    "web/sub/deeper/part_001.arrow": 3_000,
    "code/part_000.arrow": 120_000,
    "code/part_001.idx": 500,
    "meta/counts.csv": 100,
    "empty.bin": 0,
}


@pytest.fixture
def source(tmp_path, s3, bucket):
    files = tree(tmp_path / "src", SIZES)
    upload_tree(s3.client(), bucket, str(tmp_path / "src"), "shards")
    return f"s3://{bucket}/shards", files


def download(*args, endpoint):
    return main(["download", *map(str, args), "--endpoint-url", endpoint, "--backoff", "0.01"])


def test_download_copies_the_tree_and_a_rerun_transfers_nothing(source, s3, tmp_path, capsys):
    url, files = source
    dest = tmp_path / "dest"
    assert download(url, dest, "--jobs", 4, endpoint=s3.url) == 0
    assert local_files(dest) == files
    assert "downloaded 6 file(s)" in capsys.readouterr().out
    assert download(url, dest, endpoint=s3.url) == 0
    assert "downloaded 0 file(s), 0 B" in capsys.readouterr().out
    # Without the record of verified files the ETags are recomputed: still nothing to do.
    os.remove(dest / MANIFEST)
    assert download(url, dest, endpoint=s3.url) == 0
    assert "0 file(s) to download (0 B), 6 already complete" in capsys.readouterr().out
    # A changed local file is not complete any more.
    (dest / "web" / "part_000.arrow").write_bytes(b"x" * 70_000)
    assert download(url, dest, endpoint=s3.url) == 0
    assert "downloaded 1 file(s), 70.0 kB" in capsys.readouterr().out
    assert local_files(dest) == files


def test_include_exclude_and_dry_run(source, s3, tmp_path, capsys):
    url, files = source
    dest = tmp_path / "dest"
    assert (
        download(
            url, dest, "--include", "*.arrow", "--exclude", "code/*", "--dry-run", endpoint=s3.url
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "dry run: 2 file(s) to download (73.0 kB), 0 already complete, 4 filtered out" in out
    assert not dest.exists()
    assert download(url, dest, "--include", "*.arrow", "--exclude", "code/*", endpoint=s3.url) == 0
    assert local_files(dest) == {k: v for k, v in files.items() if k.startswith("web/")}


def test_keys_that_escape_dest_are_refused(s3, bucket, tmp_path, capsys):
    client = s3.client()
    for key in [
        "shards/../evil.bin",
        "shards/a/../../evil2.bin",
        "shards//abs.bin",
        "shards/C:/drive.bin",
        "shards/good/x.bin",
    ]:
        client.put_object(Bucket=bucket, Key=key, Body=b"payload")
    dest = tmp_path / "sandbox" / "dest"
    assert download(f"s3://{bucket}/shards", dest, endpoint=s3.url) == 1
    err = capsys.readouterr().err
    assert "refused '../evil.bin': parent reference '..'" in err
    assert "refused 'a/../../evil2.bin': parent reference '..'" in err
    assert "refused '/abs.bin': absolute path" in err
    assert "refused 'C:/drive.bin': drive letter" in err
    assert local_files(dest) == {"good/x.bin": b"payload"}
    everything = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs]
    assert all(p.startswith(str(dest) + os.sep) for p in everything)


def test_transient_failures_are_retried_and_the_copy_is_exact(source, proxy, tmp_path):
    url, files = source
    flaky = proxy("500", "503", "drop", "cut", every=2)
    assert download(url, tmp_path / "dest", "--jobs", 3, endpoint=flaky.url) == 0
    assert local_files(tmp_path / "dest") == files
    assert sum(flaky.injected.values()) >= 4


def test_corrupted_bytes_fail_the_md5_check_and_never_appear(
    source, proxy, tmp_path, capsys, monkeypatch
):
    url, files = source
    # botocore checks whole-object reads against the upload's CRC itself; ranged reads of
    # large objects it cannot. Turn its check off so the ETag MD5 check is what catches it.
    monkeypatch.setenv("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")
    corrupting = proxy("flip", every=1)
    assert download(url, tmp_path / "dest", endpoint=corrupting.url) == 1
    captured = capsys.readouterr()
    assert "failed web/part_000.arrow: " in captured.err and "does not match ETag" in captured.err
    assert "5 failed" in captured.out  # every non-empty file; the empty one has no bytes
    assert local_files(tmp_path / "dest") == {"empty.bin": b""}


def test_a_killed_download_is_completed_by_the_next_run(s3, bucket, proxy, tmp_path, capsys):
    big = 20 << 20  # three 8 MiB chunks each
    files = tree(tmp_path / "src", {"x/big_0.bin": big, "x/big_1.bin": big})
    upload_tree(s3.client(), bucket, str(tmp_path / "src"), "shards")
    url, dest = f"s3://{bucket}/shards", tmp_path / "dest"
    slow = proxy(delay=0.5)
    command = [
        sys.executable,
        "-m",
        "fmsdata.cli.main",
        "download",
        url,
        str(dest),
        "--endpoint-url",
        slow.url,
        "--jobs",
        "1",
    ]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    partial = []
    while time.monotonic() < deadline and child.poll() is None:
        partial = [
            os.path.join(d, f)
            for d, _, fs in os.walk(dest)
            for f in fs
            if f.endswith(PARTIAL_SUFFIX) and os.path.getsize(os.path.join(d, f)) >= 8 << 20
        ]
        if partial:
            break
        time.sleep(0.05)
    assert partial, "the download never got one chunk in"
    child.send_signal(signal.SIGKILL)
    child.wait()
    # Nothing looks complete that is not: at most the finished first file is in place.
    assert set(local_files(dest)) - {k + s for k in files for s in ("",)} <= {
        os.path.relpath(p, dest).replace(os.sep, "/") for p in partial
    } | {k for k in local_files(dest) if k.endswith(PARTIAL_SUFFIX)}
    for key, data in local_files(dest).items():
        if not key.endswith(PARTIAL_SUFFIX):
            assert data == files[key]
    assert download(url, dest, endpoint=s3.url) == 0
    out = capsys.readouterr().out
    transferred = float(out.split("downloaded ")[1].split(", ")[1].split(" MB")[0])
    assert transferred < 2 * big / 1e6  # the partial was continued, not started over
    assert local_files(dest) == files
