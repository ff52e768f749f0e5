"""The state file container: arrays grouped by dtype, a plain zip, refs checked on read;
states of an older layout refused by version (issue 15)."""

import io
import json
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import base_config, corpus, take

from fmsdata import build_dataloader
from fmsdata.cli.main import main
from fmsdata.errors import StateMismatchError
from fmsdata.state.file import save_state, state_from_bytes, state_to_bytes
from fmsdata.util.statecheck import plain_problem
from fmsdata.util.zipwrite import RLE, STRINGS, zip_bytes


def test_zip_members_read_back_by_zipfile():
    members = [("a.json", b'{"x": 1}' * 50, STRINGS), ("b.npy", bytes(range(256)) * 40, RLE)]
    data = zip_bytes(members)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.testzip() is None  # every CRC checks
        assert [(i.filename, i.compress_type) for i in archive.infolist()] == [
            ("a.json", zipfile.ZIP_DEFLATED),
            ("b.npy", zipfile.ZIP_DEFLATED),
        ]
        assert [archive.read(name) for name, _, _ in members] == [m[1] for m in members]
    assert zip_bytes(members) == data


def test_arrays_of_a_dtype_share_a_member_and_keep_their_shape_and_order():
    state = {
        "a": np.arange(6, dtype=np.uint16).reshape(2, 3),
        "b": [np.asfortranarray(np.arange(12, dtype=np.uint16).reshape(3, 4)), np.zeros(0)],
        "c": np.array([True, False]),
        "d": np.arange(5, dtype=">i4"),
    }
    data = state_to_bytes(state)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert sorted(archive.namelist()) == ["b1.npy", "f8.npy", "i4.npy", "state.json", "u2.npy"]
    back = state_from_bytes(data)
    for got, want in [
        (back["a"], state["a"]),
        (back["b"][0], state["b"][0]),
        (back["c"], state["c"]),
    ]:
        assert got.dtype == want.dtype and np.array_equal(got, want)
    assert back["b"][0].flags.f_contiguous and back["b"][1].shape == (0,)
    assert back["d"].tolist() == list(range(5))


def _with_tree(tree, arrays):
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("state.json", json.dumps(tree))
        for name, array in arrays.items():
            member = io.BytesIO()
            np.save(member, array)
            archive.writestr(f"{name}.npy", member.getvalue())
    return out.getvalue()


def test_a_whole_member_array_is_read_too():
    data = _with_tree({"x": {"__array__": "a0"}}, {"a0": np.arange(4)})
    assert state_from_bytes(data)["x"].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "ref, message",
    [
        ({"__array__": "u2", "at": 3, "shape": [2]}, r"runs past the 4 values"),
        ({"__array__": "u2", "at": -1, "shape": [2]}, r"bad array reference"),
        ({"__array__": "u2", "at": 0, "shape": "2"}, r"bad array reference"),
        ({"__array__": "u2", "at": 0, "shape": [2], "order": "X"}, r"bad array reference"),
        ({"__array__": "i8", "at": 0, "shape": [2]}, r"missing array 'i8'"),
    ],
)
def test_bad_array_references_are_refused(ref, message):
    data = _with_tree({"x": ref}, {"u2": np.arange(4, dtype=np.uint16)})
    with pytest.raises(StateMismatchError, match=message):
        state_from_bytes(data, "s.fms")


def test_a_state_of_the_old_layout_is_refused_by_its_version(tmp_path, capsys):
    info = corpus(tmp_path / "d")
    config = base_config(info)
    loader = build_dataloader(config)
    take(loader, 3)
    state = loader.snapshot()
    state["version"] = 2  # as saved before buffers had their own columns
    for entry in state["shards"]:
        buffer = entry["state"]["stages"]
        buffer["buffer"] = {"spans": np.zeros((2, 5), dtype=np.int32), "offsets": np.array([0, 2])}
    with pytest.raises(
        StateMismatchError, match=r"version=2, this fmsdata reads versions \[3, 4, 5, 6\]"
    ):
        build_dataloader(config).load_state_dict(state)
    save_state(tmp_path / "old.fms", state)
    assert main(["state", "show", str(tmp_path / "old.fms")]) == 2
    assert "version=2, this fmsdata reads versions [3, 4, 5, 6]" in capsys.readouterr().err


_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False),
    st.text(max_size=4),
    st.builds(np.int32, st.integers(-5, 5)),
    st.builds(lambda n: np.arange(n, dtype=np.int16), st.integers(0, 4)),
    st.builds(lambda n: np.array(["x"] * n), st.integers(0, 3)),  # strings: saved as they are
    # Not plain: what neither a state file nor a worker's item can carry as it is.
    st.builds(set, st.lists(st.integers(), max_size=2)),
    st.builds(lambda n: np.array([None] * n, dtype=object), st.integers(0, 2)),
    st.builds(object),
)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.text(max_size=3), st.integers(0, 3)), inner, max_size=3),
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(_VALUES)
def test_plain_data_is_what_a_state_file_can_hold(value):
    """``plain_problem`` (what a user stage's state is checked with, G6) passes exactly the
    values the state file writer saves, and names a place inside any other."""
    problem = plain_problem({"value": value})
    try:
        state_to_bytes({"value": value})
    except TypeError:
        assert problem is not None and problem.startswith("value")
    else:
        assert problem is None
