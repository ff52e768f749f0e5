"""G8 for every format: corrupt input gets a typed error naming the file."""

import json
import os

import numpy as np
import pyarrow as pa
import pytest
from formats import pbin_bytes, write_mds
from support import take

from fmsdata import build_dataloader
from fmsdata.errors import ConfigError, ShardFormatError
from fmsdata.handlers import (
    HFArrowHandler,
    JsonlHandler,
    MdsHandler,
    MegatronHandler,
    ParquetHandler,
    PbinHandler,
)
from fmsdata.handlers.megatron import write_megatron
from fmsdata.util.textcorpus import bundled_tokenizer_path

DOCS = [np.arange(10 * i + 5, 10 * i + 5 + 3 + i % 4, dtype=np.uint16) for i in range(12)]


@pytest.fixture
def megatron(tmp_path):
    write_megatron(str(tmp_path / "m"), DOCS)
    return tmp_path / "m"


def test_megatron_reads_back(megatron):
    handler = MegatronHandler()
    reader = handler.open(str(megatron) + ".idx")
    assert [handler.get(reader, i).tolist() for i in range(12)] == [d.tolist() for d in DOCS]


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda idx, b: idx.write_bytes(b"NOTMAGIC!" + idx.read_bytes()[9:]), "bad magic"),
        (
            lambda idx, b: idx.write_bytes(
                idx.read_bytes()[:9] + np.uint64(2).tobytes() + idx.read_bytes()[17:]
            ),
            "version 2",
        ),
        (lambda idx, b: idx.write_bytes(idx.read_bytes()[:60]), "truncated index"),
        (lambda idx, b: b.write_bytes(b.read_bytes()[:20]), "points past the end"),
        (
            lambda idx, b: idx.write_bytes(
                idx.read_bytes()[:17] + bytes([6]) + idx.read_bytes()[18:]
            ),
            "dtype code 6",
        ),
    ],
)
def test_megatron_damage_is_named(megatron, damage, message):
    idx, binary = megatron.with_suffix(".idx"), megatron.with_suffix(".bin")
    damage(idx, binary)
    with pytest.raises(ShardFormatError, match=rf"m\.idx: .*{message}"):
        MegatronHandler().open(str(idx))


def test_pbin_crafted_pickle_does_not_run(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pbin"
    path.write_bytes(pbin_bytes(DOCS, 1, index=[(0, 2), Payload()]))
    with pytest.raises(ShardFormatError, match=r"evil\.pbin \(index\): .*opcode"):
        PbinHandler().open(str(path))
    assert not marker.exists()
    path.write_bytes(pbin_bytes(DOCS, 1, index={"not": "pairs"}))
    with pytest.raises(ShardFormatError, match="evil.pbin"):
        PbinHandler().open(str(path))


def test_pbin_truncation_and_bad_index(tmp_path):
    path = tmp_path / "x.pbin"
    data = pbin_bytes(DOCS, 1)
    path.write_bytes(data[:30])
    with pytest.raises(ShardFormatError, match=r"x\.pbin: truncated"):
        PbinHandler().open(str(path))
    path.write_bytes(pbin_bytes(DOCS, 1, index=[(0, 4), (4, 10_000)]))
    with pytest.raises(ShardFormatError, match="past the end"):
        PbinHandler().open(str(path))


def test_jsonl_bad_lines_are_counted_or_fatal(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("FMSDATA_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "data" / "web"
    folder.mkdir(parents=True)
    lines = [json.dumps({"text": f"document number {i} says hello"}) for i in range(6)]
    lines[2] = "{not json"
    lines[4] = json.dumps({"body": "wrong field"})
    (folder / "a.jsonl").write_text("\n".join(lines) + "\n")
    handler = JsonlHandler(bundled_tokenizer_path())
    reader = handler.open(str(folder / "a.jsonl"))
    assert handler.num_docs(reader) == 4 and reader.meta["skipped_records"] == 2
    assert "skipped 2 malformed line(s)" in caplog.text
    strict = JsonlHandler(bundled_tokenizer_path(), strict=True, cache_dir=str(tmp_path / "other"))
    with pytest.raises(ShardFormatError, match=r"a\.jsonl:3: invalid JSON"):
        strict.open(str(folder / "a.jsonl"))
    with pytest.raises(ConfigError, match="tokenizer"):
        JsonlHandler(None)


def test_mds_pickle_columns_that_are_not_pickled_arrays_are_refused(tmp_path):
    """A ``pkl`` column is read through the allow-list reader (tests/handlers/
    test_safe_pickle.py); raw token bytes under that encoding are a malformed pickle."""
    write_mds(tmp_path, {"d": [DOCS]})
    index = tmp_path / "d" / "index.json"
    meta = json.loads(index.read_text())
    meta["shards"][0]["column_encodings"][1] = "pkl"
    index.write_text(json.dumps(meta))
    reader = MdsHandler().open(str(tmp_path / "d" / "shard.00000.mds"))
    with pytest.raises(ShardFormatError, match="sample 0"):
        MdsHandler().get(reader, 0)


def test_hf_arrow_nulls_and_types(tmp_path):
    path = tmp_path / "x.arrow"
    schema = pa.schema([("input_ids", pa.list_(pa.uint16()))])
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(
            pa.record_batch([pa.array([[1, 2], None], pa.list_(pa.uint16()))], schema=schema)
        )
    with pytest.raises(ShardFormatError, match=r"x\.arrow: .*null document"):
        HFArrowHandler().open(str(path))
    with pytest.raises(ShardFormatError, match="no token column 'tokens'"):
        HFArrowHandler("tokens").open(str(path))


def test_parquet_columns_are_checked(tmp_path):
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"tokens": [1, 2, 3]}), str(tmp_path / "a.parquet"))
    with pytest.raises(ShardFormatError, match=r"a\.parquet: column 'tokens' has type int64"):
        ParquetHandler().open(str(tmp_path / "a.parquet"))
    pq.write_table(pa.table({"text": ["hello"]}), str(tmp_path / "b.parquet"))
    with pytest.raises(ConfigError, match="set tokenizer"):
        ParquetHandler().open(str(tmp_path / "b.parquet"))
    pq.write_table(pa.table({"other": ["hello"]}), str(tmp_path / "c.parquet"))
    with pytest.raises(ShardFormatError, match="no token column 'tokens' and no text column"):
        ParquetHandler().open(str(tmp_path / "c.parquet"))


def test_token_ids_outside_the_vocabulary_name_the_file(tmp_path):
    (tmp_path / "d").mkdir()
    write_megatron(str(tmp_path / "d" / "m"), [*DOCS, np.array([5, 60000, 7], dtype=np.uint16)])
    loader = build_dataloader(
        dict(
            data_path=str(tmp_path),
            file_type="megatron",
            seq_length=16,
            batch_size=2,
            logical_shards=1,
            vocab_size=1000,
        )
    )
    with pytest.raises(
        ShardFormatError, match=r"m\.idx: document 12 holds token id 60000, outside vocab_size=1000"
    ):
        take(loader, 10)


@pytest.mark.parametrize("layout", ["arrow", "hf_arrow", "parquet", "mds", "flat", "jsonl_gz"])
def test_a_truncated_file_is_named(layout, tmp_path, monkeypatch):
    """Cut a shard short: opening and reading it fails with the file's name, never with a
    bare exception or silently fewer documents."""
    from formats import write_arrow, write_flat, write_hf_arrow, write_jsonl, write_parquet_tokens

    from fmsdata.handlers import make_handler

    monkeypatch.setenv("FMSDATA_CACHE", str(tmp_path / "cache"))
    docs = {"d": [DOCS * 20]}
    writers = {
        "arrow": lambda: write_arrow(tmp_path, docs),
        "hf_arrow": lambda: write_hf_arrow(tmp_path, docs, file_format=True),
        "parquet": lambda: write_parquet_tokens(tmp_path, docs),
        "mds": lambda: write_mds(tmp_path, docs),
        "flat": lambda: write_flat(tmp_path, docs, eos=1),
        "jsonl_gz": lambda: write_jsonl(tmp_path, {"d": [["some text"] * 400]}, compression="gz"),
    }
    writers[layout]()
    (path,) = [
        os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "d") for f in fs if f != "index.json"
    ]
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:
        handle.truncate(size // 2 + 1)  # odd: not whole uint16 tokens either
    handler = make_handler(
        "auto",
        col_name="input_ids" if layout == "hf_arrow" else "tokens",
        token_dtype="uint16",
        separator=1,
        tokenizer=bundled_tokenizer_path(),
        strict=True,  # else a cut compressed stream is a counted bad record (test_damage.py)
    )
    with pytest.raises(ShardFormatError, match=os.path.basename(path)):
        reader = handler.open(path)
        for i in range(handler.num_docs(reader)):
            handler.get(reader, i)


@pytest.mark.parametrize("layout", ["arrow", "hf_arrow", "flat"])
def test_a_truncated_file_is_called_truncated(layout, tmp_path):
    """A cut shard is said to be cut, with its size: not "Not an Arrow file", not a doubt
    about token_dtype."""
    from formats import write_arrow, write_flat, write_hf_arrow

    from fmsdata.handlers import ArrowDocHandler, FlatTokensHandler

    docs = {"d": [DOCS * 20]}
    if layout == "arrow":
        write_arrow(tmp_path, docs)
        handler = ArrowDocHandler()
    elif layout == "hf_arrow":
        write_hf_arrow(tmp_path, docs, file_format=True)
        handler = HFArrowHandler(col_name="input_ids")
    else:
        write_flat(tmp_path, docs, eos=1)
        handler = FlatTokensHandler(token_dtype="uint16", separator=1, cache_dir=str(tmp_path))
    (path,) = (tmp_path / "d").iterdir()
    size = os.path.getsize(path) // 2 + 1
    with open(path, "r+b") as handle:
        handle.truncate(size)
    with pytest.raises(ShardFormatError) as caught:
        handler.open(str(path))
    message = str(caught.value)
    assert message.startswith(f"{path}: truncated")
    assert f"{size:,} bytes" in message
    assert "Not an Arrow file" not in message and "token_dtype right" not in message


def test_an_arrow_stream_read_as_arrow_files_says_so(tmp_path):
    from formats import write_hf_arrow

    from fmsdata.handlers import ArrowDocHandler

    write_hf_arrow(tmp_path, {"d": [DOCS]})  # the stream format
    (path,) = (tmp_path / "d").iterdir()
    with pytest.raises(ShardFormatError, match="an Arrow IPC stream, not an Arrow IPC file"):
        ArrowDocHandler().open(str(path))
