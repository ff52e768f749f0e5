"""A moto S3 server on 127.0.0.1 for the remote tests: started once per module, stopped
after; each test gets its own bucket. Credentials come from the AWS environment variables
(as users' usually do)."""

import gc
import hashlib
import pathlib

import pytest
from s3local import CREDENTIALS, REGION, FaultProxy, S3Server, upload_tree
from support import corpus

from fmsdata.data.indexing import index_root
from fmsdata.handlers import ArrowDocHandler

HERE = pathlib.Path(__file__).parent


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.parent == HERE:
            item.add_marker(pytest.mark.remote)


@pytest.fixture(autouse=True)
def collect_dropped_loaders():
    """Shut down, at the end of the test that made them, the DataLoader workers of loaders
    it left iterating: collected later, on whatever thread (fsspec's IO loop in another
    test), joining workers busy with remote reads blocks that thread for seconds."""
    yield
    gc.collect()


@pytest.fixture(scope="module")
def s3():
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def aws_env(monkeypatch):
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key.upper(), value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def bucket(s3, aws_env, request):
    name = "t-" + hashlib.blake2b(request.node.nodeid.encode(), digest_size=8).hexdigest()
    s3.client().create_bucket(Bucket=name)
    return name


@pytest.fixture
def data(tmp_path, s3, bucket):
    """A nested corpus with counts metadata, on local disk and in the bucket (``root/``)."""
    info = corpus(tmp_path / "data", {"a": 3, "b": 2}, nested=True)
    index_root(info.root, ArrowDocHandler())
    upload_tree(s3.client(), bucket, info.root, "root")
    return info


@pytest.fixture
def proxy(s3):
    proxies = []

    def make(*faults, every=3, delay=0.0, hold=None):
        p = FaultProxy(s3.url, faults, every=every, delay=delay, hold=hold)
        proxies.append(p)
        return p

    yield make
    # Loaders a test left iterating shut their workers down when collected; collected
    # later, on whatever thread (fsspec's IO loop, in a later test), their workers would
    # still be retrying reads from this proxy, and joining them blocks that thread.
    gc.collect()
    for p in proxies:
        p.stop()
