"""Documents located from an Arrow file's footer and batch headers (``arrow_index``),
checked against the writer's documents: each located ``(start, length)`` reads back
exactly the tokens written. Layouts the fast path does not handle (compressed bodies,
nulls) give None (the handler then asks pyarrow), and damaged metadata never makes it
read outside the file: it gives None or locations inside the file, never a crash."""

import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import scratch_dir

from fmsdata.handlers.arrow_index import RecordBatchIndex

DTYPES = {"int16": pa.int16(), "uint16": pa.uint16(), "int32": pa.int32(), "int64": pa.int64()}


def write(path, docs, dtype, lead, compression=None, nulls=False):
    """One record batch per document: an optional fixed-width column, then ``tokens``."""
    fields = ([pa.field("id", pa.float64())] if lead else []) + [pa.field("tokens", DTYPES[dtype])]
    schema = pa.schema(fields)
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema, options=options) as w:
        for i, doc in enumerate(docs):
            values = [None if nulls and j == 0 else v for j, v in enumerate(doc.tolist())]
            tokens = pa.array(values, type=DTYPES[dtype])
            columns = ([pa.array([float(i)] * len(doc))] if lead else []) + [tokens]
            w.write_batch(pa.record_batch(columns, schema=schema))
    return np.memmap(path, dtype=np.uint8, mode="r")


documents = st.lists(st.integers(0, 40), min_size=1, max_size=30).flatmap(
    lambda lengths: st.tuples(
        st.just(lengths), st.integers(0, 2**31 - 1), st.sampled_from(sorted(DTYPES))
    )
)


@settings(max_examples=40, deadline=None)
@given(spec=documents, lead=st.booleans(), pick=st.integers(0, 2**31 - 1))
def test_located_documents_read_back_what_was_written(spec, lead, pick):
    lengths, seed, dtype = spec
    rng = np.random.default_rng(seed)
    info = np.iinfo(np.dtype(dtype))
    docs = [
        rng.integers(max(info.min, -1000), min(info.max, 60000), n).astype(dtype) for n in lengths
    ]
    buf = write(os.path.join(scratch_dir(), "a.arrow"), docs, dtype, lead)
    index = RecordBatchIndex.read(buf)
    assert index is not None and len(index) == len(docs)
    chosen = np.unique(np.random.default_rng(pick).integers(0, len(docs), len(docs)))
    located = index.locate(buf, chosen, int(lead), np.dtype(dtype).itemsize)
    assert located is not None
    flat = buf[: len(buf) // np.dtype(dtype).itemsize * np.dtype(dtype).itemsize].view(dtype)
    for i, start, length in zip(chosen.tolist(), *located):
        assert np.array_equal(flat[start : start + length], docs[i]), f"document {i}"


@pytest.mark.parametrize("how", ["lz4", "zstd", "nulls"])
def test_layouts_outside_the_fast_path_give_none(how):
    docs = [np.arange(5, dtype="int32"), np.arange(3, dtype="int32")]
    compression = None if how == "nulls" else how
    buf = write(
        os.path.join(scratch_dir(), "b.arrow"), docs, "int32", False, compression, how == "nulls"
    )
    index = RecordBatchIndex.read(buf)
    assert index is not None
    assert index.locate(buf, np.arange(2), 0, 4) is None


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 20), min_size=1, max_size=8),
    damage=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6),
)
def test_damaged_headers_never_read_outside_the_file(lengths, damage):
    docs = [np.arange(n, dtype="int32") for n in lengths]
    path = os.path.join(scratch_dir(), "c.arrow")
    clean = write(path, docs, "int32", False)
    index = RecordBatchIndex.read(clean)
    data = bytearray(clean.tobytes())
    footer = index.footer
    for where, value in damage:  # inside the batches' messages, not the footer
        data[8 + where % max(1, footer - 8)] = value
    buf = np.frombuffer(bytes(data), dtype=np.uint8)
    located = index.locate(buf, np.arange(len(docs)), 0, 4)
    if located is not None:
        starts, found = located
        assert (found >= 0).all() and ((starts + found) * 4 <= footer).all()
