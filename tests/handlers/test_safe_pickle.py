"""Pickled numpy arrays (MDS ``pkl`` columns, CEPE) read without unpickling: integer
arrays come back exactly; any other global is refused before anything runs."""

import json
import os
import pickle

import numpy as np
import pytest
from formats import _mds_writer_class, write_mds

from fmsdata.errors import ShardFormatError
from fmsdata.handlers import MdsHandler
from fmsdata.handlers.safe_pickle import read_int_array, read_int_pairs


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", ["int64", "uint16", "uint32", "int32", "uint8", ">i4"])
def test_integer_arrays_round_trip(protocol, dtype):
    array = (np.arange(700) * 37 % 251).astype(dtype)
    got = read_int_array(pickle.dumps(array, protocol=protocol), "x")
    assert got.dtype == array.dtype and np.array_equal(got, array)
    empty = read_int_array(pickle.dumps(np.zeros(0, dtype), protocol=protocol), "x")
    assert len(empty) == 0


class Boom:
    """Unpickling this runs ``os.system`` (creating a file): the attack to refuse."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w').close()",))


@pytest.mark.parametrize("attack", [Boom, Evil])
def test_other_globals_are_refused_and_run_nothing(tmp_path, attack):
    marker = tmp_path / "ran"
    data = pickle.dumps(attack(marker))
    for reader in (read_int_array, read_int_pairs):
        with pytest.raises(ShardFormatError, match="refused|opcode"):
            reader(data, "sample 3")
    # The same call inside an array's state, and an array of objects, fare no better.
    wrapped = pickle.dumps([np.arange(3), attack(marker)])
    with pytest.raises(ShardFormatError):
        read_int_array(wrapped, "x")
    with pytest.raises(ShardFormatError, match="not an integer type|refused"):
        read_int_array(pickle.dumps(np.array([1, "a"], dtype=object)), "x")
    assert not marker.exists()  # the control: plain pickle.loads(data) would create it


@pytest.mark.parametrize(
    "value, match",
    [
        (np.arange(4.0), "not an integer type"),
        (np.zeros((2, 2), np.int64), "not a 1-D integer array"),
        ([1, 2, 3], "not a 1-D integer array"),
    ],
)
def test_non_token_values_are_refused(value, match):
    with pytest.raises(ShardFormatError, match=match):
        read_int_array(pickle.dumps(value), "x")


def test_truncated_pickle_is_a_format_error():
    data = pickle.dumps(np.arange(50))
    for cut in (5, len(data) // 2, len(data) - 1):
        with pytest.raises(ShardFormatError):
            read_int_array(data[:cut], "x")


def test_mds_pkl_column_from_streamings_writer(tmp_path):
    """CEPE's layout: MDSWriter with a ``pkl`` column of int64 arrays."""
    writer_class = _mds_writer_class()
    docs = [np.arange(5 * k, 5 * k + k + 1, dtype=np.int64) for k in range(30)]
    out = tmp_path / "mds"
    with writer_class(out=str(out), columns={"input_ids": "pkl"}, size_limit=1 << 12) as writer:
        for doc in docs:
            writer.write({"input_ids": doc})
    handler = MdsHandler(col_name="input_ids")
    got = []
    for shard in handler.select(sorted(str(p) for p in out.iterdir())):
        reader = handler.open(shard)
        got.extend(handler.get(reader, i) for i in range(handler.num_docs(reader)))
    assert len(got) == len(docs)
    assert all(g.dtype == np.int64 and np.array_equal(g, d) for g, d in zip(got, docs))


def test_mds_pkl_sample_holding_a_call_is_refused(tmp_path):
    write_mds(tmp_path, {"d": [[np.arange(4, dtype=np.uint16)]]})
    index = tmp_path / "d" / "index.json"
    meta = json.loads(index.read_text())
    meta["shards"][0]["column_encodings"][1] = "pkl"
    index.write_text(json.dumps(meta))
    reader = MdsHandler().open(str(tmp_path / "d" / "shard.00000.mds"))
    with pytest.raises(ShardFormatError, match=r"shard\.00000\.mds sample 0"):
        MdsHandler().get(reader, 0)
