"""get_dataset over a root in S3 (a moto server on loopback): the windows of the same
data on local disk, by name under an S3 $FMSDATA_DATA_DIR too, files pulled on demand."""

import os

import numpy as np
import pytest
from formats import write_flat
from s3local import upload_tree

import fmsdata
import fmsdata.mapstyle.dataset
from fmsdata.remote.storage import Storage

pytestmark = pytest.mark.remote

EOS = 2


def test_s3_root_gives_the_local_windows(tmp_path, s3, bucket, monkeypatch):
    monkeypatch.setenv("FMSDATA_CACHE", str(tmp_path / "cache"))
    docs = [
        [np.arange(10 * k + 3, 10 * k + 3 + 5 + k % 7) for k in range(f, f + 9)] for f in (0, 9)
    ]
    write_flat(tmp_path / "data" / "corpus", {"web": docs}, EOS)
    (tmp_path / "data" / "corpus" / "metadata.json").write_text(
        '{"datasets": {"web": {"format": "flat", "eos_token": 2, "documents_end_with_eos": true}},'
        ' "tokenizer": {"vocab_size": 1000}}'
    )
    upload_tree(s3.client(), bucket, str(tmp_path / "data"), "data")
    storage = Storage(endpoint_url=s3.url)
    local = fmsdata.get_dataset(str(tmp_path / "data" / "corpus"), 12, token_dtype="uint16")
    monkeypatch.setenv("FMSDATA_DATA_DIR", f"s3://{bucket}/data")
    for target in ("corpus", f"s3://{bucket}/data/corpus"):
        remote = fmsdata.get_dataset(target, 12, token_dtype="uint16", storage=storage)
        assert len(remote) == len(local) and remote.vocab_size == 1000
        for i in range(len(local)):
            assert remote[i]["token_ids"].tolist() == local[i]["token_ids"].tolist()
            assert remote[i]["document_ids"].tolist() == local[i]["document_ids"].tolist()
        remote.close()


def test_s3_root_files_go_to_the_remote_cache_folder_and_evict_only_there(
    tmp_path, s3, bucket, monkeypatch
):
    """get_dataset pulls a remote root's files into ``<cache>/remote`` as the loader does
    (one fetch per file for both), and trimming that cache never removes what else lives
    in the cache folder: derived token caches readers map, counts caches."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("FMSDATA_CACHE", str(cache))
    monkeypatch.setattr(fmsdata.mapstyle.dataset, "CACHE_LIMIT", 1)  # trim at each fetch
    docs = [[np.arange(10 * k + 3, 10 * k + 13) for k in range(f, f + 4)] for f in (0, 4, 8)]
    write_flat(tmp_path / "data" / "corpus", {"web": docs}, EOS)
    upload_tree(s3.client(), bucket, str(tmp_path / "data"), "data")
    derived = cache / "text" / "derived.tokens"  # another user of the cache folder
    derived.parent.mkdir(parents=True)
    derived.write_bytes(b"x" * 100)
    os.utime(derived, (1000, 1000))  # older than anything the dataset fetches
    storage = Storage(endpoint_url=s3.url)
    remote = fmsdata.get_dataset(
        f"s3://{bucket}/data/corpus", 8, token_dtype="uint16", storage=storage, eos_token=EOS
    )
    windows = [remote[i]["token_ids"].tolist() for i in range(len(remote))]
    remote.close()
    assert windows and derived.read_bytes() == b"x" * 100
    fetched = [
        os.path.relpath(os.path.join(folder, name), cache)
        for folder, _, names in os.walk(cache)
        for name in names
        if name.endswith(".npy") and "web" in folder
    ]
    assert fetched and all(path.startswith("remote" + os.sep) for path in fetched), fetched
