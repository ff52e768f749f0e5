"""``fmsdata.remote.folder``: the same folder operations on local disk, an in-memory fsspec
filesystem, an object store (the moto S3 server) and a filesystem that writes through a
temporary name and a rename."""

import os
import uuid

import fsspec
import pytest

from fmsdata.errors import RemoteIOError
from fmsdata.remote import folder as folder_module
from fmsdata.remote.folder import Folder
from fmsdata.remote.retry import RetryPolicy
from fmsdata.remote.storage import Storage

KINDS = ["local", "file-url", "memory", "memory-renamed", "s3"]


@pytest.fixture(params=KINDS)
def place(request, tmp_path, monkeypatch):
    """An empty folder location of each kind, and the storage that reaches it."""
    kind = request.param
    if kind in ("local", "file-url"):
        prefix = "file://" if kind == "file-url" else ""
        yield f"{prefix}{tmp_path}/f", Storage()
    elif kind == "s3":
        s3 = request.getfixturevalue("s3")
        bucket = request.getfixturevalue("bucket")
        yield f"s3://{bucket}/f", Storage(endpoint_url=s3.url, retry=RetryPolicy(backoff=0.01))
    else:
        if kind == "memory-renamed":  # as sftp://, hdfs://...: temporary name, then fs.mv
            monkeypatch.setattr(folder_module, "ATOMIC_PUT_PROTOCOLS", frozenset())
        url = f"memory://t-{uuid.uuid4().hex}/f"
        yield url, Storage()
        memory = fsspec.filesystem("memory")
        if memory.exists(url):
            memory.rm(url, recursive=True)


def test_write_read_list_delete_remove(place):
    where, storage = place
    folder = Folder(where, storage)
    assert folder.names() == []
    assert not folder.is_file("a")
    assert folder.write("a", b"one") == folder.join("a")
    folder.write("b", b"")
    folder.sub("sub").write("c", b"three")
    assert folder.names() == ["a", "b", "sub"]
    assert folder.read("a") == b"one" and folder.read("b") == b""
    assert Folder(folder.join("a"), storage).read() == b"one"
    assert folder.is_file("a") and not folder.is_file("sub")
    assert Folder(folder.join("a"), storage).is_file()
    folder.write("a", b"again")  # replaced whole
    assert folder.read("a") == b"again"
    assert folder.names() == ["a", "b", "sub"]  # no temporary name left behind
    folder.delete("b")
    folder.delete("b")  # already gone is fine
    assert folder.names() == ["a", "sub"]
    with pytest.raises(FileNotFoundError):
        folder.read("b")
    folder.remove(first=("a",))
    assert folder.names() == []
    folder.remove()  # already gone is fine


def test_join_keeps_the_form_given(tmp_path):
    assert Folder(str(tmp_path)).join("x") == os.path.join(str(tmp_path), "x")
    assert Folder("s3://b/p/").join("x") == "s3://b/p/x"
    assert Folder("s3://b/p").sub("q").join("x") == "s3://b/p/q/x"


def test_a_local_write_cut_short_leaves_the_old_file(tmp_path, monkeypatch):
    folder = Folder(str(tmp_path))
    folder.write("a", b"old")

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        folder.write("a", b"new")
    monkeypatch.undo()
    assert folder.read("a") == b"old"
    assert folder.names() == ["a"]  # the temporary file was removed


def test_a_write_refused_by_the_store_names_the_url(s3, aws_env):
    storage = Storage(endpoint_url=s3.url, retry=RetryPolicy(tries=1))
    folder = Folder("s3://no-such-bucket-anywhere/p", storage)
    with pytest.raises(RemoteIOError, match="s3://no-such-bucket-anywhere/p/a"):
        folder.write("a", b"x")


def test_a_listing_sees_what_another_client_wrote_meanwhile(s3, aws_env, bucket):
    """Two clients (two processes, in a job): the second's write is in the first's next
    listing, whatever fsspec cached from the first one."""
    mine = Folder(f"s3://{bucket}/f", Storage(endpoint_url=s3.url))
    theirs = Folder(
        f"s3://{bucket}/f", Storage(endpoint_url=s3.url, options={"default_block_size": 1 << 20})
    )
    mine.write("a", b"1")
    assert mine.names() == ["a"]
    assert (
        mine.storage.filesystem(mine.location)[0]
        is not theirs.storage.filesystem(theirs.location)[0]
    )
    theirs.write("b", b"2")
    assert mine.names() == ["a", "b"]
    assert mine.is_file("b")
    theirs.delete("a")
    assert mine.names() == ["b"]
    assert not mine.is_file("a")
