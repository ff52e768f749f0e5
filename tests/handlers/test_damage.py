"""Damage that used to be read without a word: patched Arrow list offsets, cut or corrupt
compressed JSON lines, cut and tiny MDS shards."""

import gzip
import json
import os

import numpy as np
import pytest
import zstandard
from formats import write_hf_arrow, write_jsonl, write_mds
from support import take

from fmsdata import build_dataloader
from fmsdata.errors import EmptyDatasetError, ShardFormatError
from fmsdata.handlers import HFArrowHandler, JsonlHandler, MdsHandler
from fmsdata.handlers.text import TextTokenizer
from fmsdata.util.textcorpus import bundled_tokenizer_path

DOCS = [np.arange(10 * i + 5, 10 * i + 5 + 3 + i % 4, dtype=np.uint16) for i in range(12)]
TEXTS = [f"document {i} holds a few words, number {i * 7}" for i in range(40)]


def hf_file(tmp_path):
    write_hf_arrow(tmp_path, {"x": [DOCS]}, rows_per_batch=8, file_format=True)
    path = tmp_path / "x" / "part_000.arrow"
    offsets = np.cumsum([0] + [len(d) for d in DOCS[:8]]).astype(np.int32).tobytes()
    at = path.read_bytes().find(offsets)
    assert at > 0
    return path, at


@pytest.mark.parametrize(
    "entry, value, message",
    [
        (3, 1000, "offsets decrease at row 3"),
        (3, -5, "offsets decrease at row 2"),
        (0, -2, "first list offset is -2"),
        (0, 2, "first list offset is 2"),
        (8, 10**6, "end at 1000000, the values hold 36"),
        (8, 30, "end at 30, the values hold 36"),
    ],
)
def test_patched_arrow_list_offsets_are_refused_on_open(tmp_path, entry, value, message):
    path, at = hf_file(tmp_path)
    data = bytearray(path.read_bytes())
    data[at + 4 * entry : at + 4 * entry + 4] = np.int32(value).tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(ShardFormatError, match=rf"part_000\.arrow: .*batch 0: .*{message}"):
        HFArrowHandler().open(str(path))


def jsonl_file(tmp_path, compression):
    write_jsonl(tmp_path, {"j": [TEXTS]}, compression=compression)
    (path,) = (tmp_path / "j").iterdir()
    return path


def tokens_of(texts):
    return [list(ids) for ids in TextTokenizer(bundled_tokenizer_path()).encode(texts)]


def read_docs(handler, path):
    reader = handler.open(str(path))
    return [handler.get(reader, i).tolist() for i in range(handler.num_docs(reader))]


@pytest.mark.parametrize("compression", ["gz", "zst"])
@pytest.mark.parametrize("keep", [0, 1, 9, 0.5, -1])
def test_a_cut_compressed_jsonl_is_never_a_silent_short_read(tmp_path, compression, keep, caplog):
    path = jsonl_file(tmp_path, compression)
    data = path.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep % len(data)
    path.write_bytes(data[:cut])
    strict = JsonlHandler(bundled_tokenizer_path(), strict=True, cache_dir=str(tmp_path / "s"))
    with pytest.raises(ShardFormatError, match=rf"{path.name}: .*(truncated|empty|corrupt)"):
        strict.open(str(path))
    assert not [f for _, _, fs in os.walk(tmp_path / "s") for f in fs]  # no partial cache
    lenient = JsonlHandler(bundled_tokenizer_path(), cache_dir=str(tmp_path / "l"))
    docs = read_docs(lenient, path)
    assert docs == tokens_of(TEXTS)[: len(docs)]
    reader = lenient.open(str(path))
    assert reader.meta["damage"].startswith(f"{path}: ")
    assert f"kept the {len(docs)} whole document(s) before it" in caplog.text


@pytest.mark.parametrize("compression", ["gz", "zst"])
@pytest.mark.parametrize("cut", [4, 1000])
def test_a_cut_compressed_jsonl_keeps_its_readable_documents(tmp_path, compression, cut, caplog):
    """Cut anywhere, even only its last 4 bytes: the whole documents before the cut are
    read (all but the last zstd block's), a warning names the file and the count kept."""
    texts = [f"document {i} says " + f"w{i} " * 20 for i in range(3000)]  # several zstd blocks
    write_jsonl(tmp_path, {"j": [texts]}, compression=compression)
    (path,) = (tmp_path / "j").iterdir()
    path.write_bytes(path.read_bytes()[:-cut])
    handler = JsonlHandler(bundled_tokenizer_path(), cache_dir=str(tmp_path / "c"))
    docs = read_docs(handler, path)
    assert docs == tokens_of(texts)[: len(docs)]
    assert len(docs) > len(texts) * 0.6
    assert f"{path}: " in caplog.text
    assert f"kept the {len(docs)} whole document(s) before it" in caplog.text


@pytest.mark.parametrize("compression", ["gz", "zst"])
def test_corrupt_compressed_jsonl_names_the_file_through_the_loader(tmp_path, compression):
    path = jsonl_file(tmp_path, compression)
    good = jsonl_file(tmp_path / "other", compression)
    data = bytearray(path.read_bytes())
    # gzip checks a CRC; a zstd frame without checksum is only caught where it is structure
    start = len(data) // 3 if compression == "gz" else 0
    for at in range(start, start + 8):
        data[at] ^= 0x5A
    path.write_bytes(bytes(data))
    handler = JsonlHandler(bundled_tokenizer_path(), strict=True, cache_dir=str(tmp_path / "c"))
    with pytest.raises(ShardFormatError, match=rf"{path.name}: corrupt"):
        handler.open(str(path))
    assert read_docs(handler, good) == tokens_of(TEXTS)
    for workers in (0, 1):
        loader = build_dataloader(
            dict(
                data_path=str(tmp_path),
                datasets=["j"],
                file_type="jsonl",
                tokenizer=bundled_tokenizer_path(),
                strict=True,
                seq_length=16,
                batch_size=2,
                logical_shards=1,
                num_workers=workers,
                cache_dir=str(tmp_path / f"cache{workers}"),
            )
        )
        with pytest.raises(ShardFormatError, match=rf"{path.name}: corrupt"):
            take(loader, 50)


def test_an_empty_gz_is_not_an_empty_shard(tmp_path, caplog):
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(b"")
    with pytest.raises(ShardFormatError, match=r"a\.jsonl\.gz: empty file, not a gzip stream"):
        JsonlHandler(bundled_tokenizer_path(), strict=True, cache_dir=str(tmp_path)).open(str(path))
    lenient = JsonlHandler(bundled_tokenizer_path(), cache_dir=str(tmp_path / "l"))
    assert "a.jsonl.gz: empty file" in lenient.open(str(path)).meta["damage"]
    assert "a.jsonl.gz: empty file" in caplog.text
    path.write_bytes(gzip.compress(b""))  # a real gzip of nothing is an empty shard
    assert read_docs(lenient, path) == []


def test_multi_frame_zst_reads_every_frame(tmp_path):
    lines = [json.dumps({"text": t}).encode() + b"\n" for t in TEXTS]
    packer = zstandard.ZstdCompressor()
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(packer.compress(b"".join(lines[:15])) + packer.compress(b"".join(lines[15:])))
    handler = JsonlHandler(bundled_tokenizer_path(), strict=True, cache_dir=str(tmp_path))
    assert read_docs(handler, path) == tokens_of(TEXTS)


@pytest.mark.parametrize("compression", [None, "zstd"])
@pytest.mark.parametrize("keep", [0, 1, 2, 3, 0.5, -1])
@pytest.mark.parametrize("sizes_in_index", [True, False])
def test_cut_mds_shards_name_the_shard_and_leave_no_cache(
    tmp_path, compression, keep, sizes_in_index
):
    write_mds(tmp_path, {"m": [DOCS]}, compression=compression)
    index = tmp_path / "m" / "index.json"
    if not sizes_in_index:
        meta = json.loads(index.read_text())
        for entry in meta["shards"]:
            for part in ("raw_data", "zip_data"):
                if entry[part]:
                    del entry[part]["bytes"]
        index.write_text(json.dumps(meta))
    path = tmp_path / "m" / ("shard.00000.mds" + (".zstd" if compression else ""))
    data = path.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep % len(data)
    path.write_bytes(data[:cut])
    cache = tmp_path / "cache"
    with pytest.raises(ShardFormatError, match=rf"m/{path.name}: "):
        MdsHandler(token_dtype="uint16", cache_dir=str(cache)).open(str(path))
    assert not [f for _, _, fs in os.walk(cache) for f in fs]


@pytest.mark.parametrize("workers", [0, 1])
def test_a_dataset_emptied_by_a_cut_file_names_the_file(tmp_path, workers):
    """The only file of a .jsonl.zst root is cut: the error about a logical shard without
    documents names the file and its damage, also from a worker."""
    path = jsonl_file(tmp_path, "zst")
    path.write_bytes(path.read_bytes()[:-4])
    loader = build_dataloader(
        dict(
            data_path=str(tmp_path),
            datasets=["j"],
            file_type="jsonl",
            tokenizer=bundled_tokenizer_path(),
            seq_length=16,
            batch_size=2,
            logical_shards=2,
            num_workers=workers,
            cache_dir=str(tmp_path / "cache"),
        )
    )
    with pytest.raises(EmptyDatasetError) as caught:
        take(loader, 5)
    message = str(caught.value)
    assert "holds no document to read: all its 1 file(s) are empty" in message
    assert f"{path}: truncated zstd stream" in message
    assert "restore the damaged file(s)" in message
