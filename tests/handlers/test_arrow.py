import numpy as np
import pyarrow as pa
import pytest

from fmsdata.errors import ShardFormatError
from fmsdata.handlers import ArrowDocHandler, make_handler
from fmsdata.handlers.arrow import write_arrow_docs


def write(path, batches, schema, compression=None):
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with (
        pa.OSFile(str(path), "wb") as sink,
        pa.ipc.new_file(sink, schema, options=options) as writer,
    ):
        for batch in batches:
            writer.write_batch(pa.record_batch(batch, schema=schema))


def docs(n=50, seed=0):
    rng = np.random.default_rng(seed)
    out, start = [], 100
    for _ in range(n):
        k = int(rng.integers(0, 60))
        out.append(np.arange(start, start + k))
        start += k
    return out


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.int32, np.int64])
def test_reads_every_document_as_a_view(tmp_path, dtype):
    path = tmp_path / "x.arrow"
    expected = docs()
    write_arrow_docs(str(path), expected, dtype=dtype)
    handler = ArrowDocHandler()
    reader = handler.open(str(path))
    assert handler.num_docs(reader) == len(expected)
    assert reader._index is not None, "the vectorized index should handle this layout"
    for i, doc in enumerate(expected):
        got = handler.get(reader, i)
        assert got.dtype == dtype and np.array_equal(got, doc)
        assert got.base is not None  # a view of the mapped file, not a copy
    lengths = handler.doc_lengths(reader, np.arange(len(expected)))
    assert (reader.starts >= 0).all() and not reader._copies
    assert lengths.tolist() == [len(d) for d in expected]
    assert handler.count(str(path)) == (len(expected), sum(len(d) for d in expected))


@pytest.mark.parametrize(
    "layout",
    ["other_int_column_first", "string_column_first", "lz4", "zstd", "sliced"],
)
def test_unusual_layouts_read_the_same(tmp_path, layout):
    expected = docs(30, seed=1)
    path = tmp_path / "x.arrow"
    if layout == "other_int_column_first":
        schema = pa.schema([("id", pa.int64()), ("input_ids", pa.uint32())])
        batches = [[pa.array(np.full(len(d), 7)), pa.array(d, pa.uint32())] for d in expected]
        write(path, batches, schema)
    elif layout == "string_column_first":
        schema = pa.schema([("url", pa.string()), ("input_ids", pa.uint32())])
        batches = [[pa.array(["u"] * len(d)), pa.array(d, pa.uint32())] for d in expected]
        write(path, batches, schema)
    elif layout in ("lz4", "zstd"):
        schema = pa.schema([("input_ids", pa.uint32())])
        write(path, [[pa.array(d, pa.uint32())] for d in expected], schema, compression=layout)
    else:
        schema = pa.schema([("input_ids", pa.uint32())])
        big = pa.array(np.arange(1000, 2000), pa.uint32())
        batches, at = [], 0
        for d in expected:
            batches.append([big.slice(at, len(d))])
            at += len(d)
        expected = [
            np.arange(1000 + a, 1000 + a + len(d))
            for a, d in zip(np.cumsum([0] + [len(d) for d in expected]), expected)
        ]
        write(path, batches, schema)
    handler = make_handler("arrow", col_name="input_ids")
    reader = handler.open(str(path))
    for i, doc in enumerate(expected):
        assert np.array_equal(handler.get(reader, i), doc), i
    first, last = handler.doc_edges(reader, np.arange(len(expected)))
    assert first.tolist() == [int(d[0]) if len(d) else -1 for d in expected]
    assert last.tolist() == [int(d[-1]) if len(d) else -1 for d in expected]


def test_truncated_file_is_a_format_error_naming_it(tmp_path):
    path = tmp_path / "cut.arrow"
    write_arrow_docs(str(path), docs())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ShardFormatError, match="cut.arrow"):
        ArrowDocHandler().open(str(path))


def test_missing_column_names_the_columns(tmp_path):
    path = tmp_path / "x.arrow"
    write_arrow_docs(str(path), docs(), col_name="input_ids")
    with pytest.raises(ShardFormatError, match=r"x\.arrow: no token column 'tokens'.*input_ids"):
        ArrowDocHandler("tokens").open(str(path))


def test_list_column_points_to_hf_arrow(tmp_path):
    path = tmp_path / "x.arrow"
    schema = pa.schema([("tokens", pa.list_(pa.uint32()))])
    write(path, [[pa.array([[1, 2, 3]], pa.list_(pa.uint32()))]], schema)
    with pytest.raises(ShardFormatError, match="hf_arrow"):
        ArrowDocHandler().open(str(path))


def test_null_tokens_are_an_error(tmp_path):
    path = tmp_path / "x.arrow"
    schema = pa.schema([("tokens", pa.uint32())])
    write(path, [[pa.array([1, None, 3], pa.uint32())]], schema)
    handler = ArrowDocHandler()
    reader = handler.open(str(path))
    with pytest.raises(ShardFormatError, match="null"):
        handler.get(reader, 0)


def test_out_of_range_document_is_an_error(tmp_path):
    path = tmp_path / "x.arrow"
    write_arrow_docs(str(path), docs(3))
    handler = ArrowDocHandler()
    with pytest.raises(ShardFormatError, match="document 3 requested, the file holds 3"):
        handler.get(handler.open(str(path)), 3)
