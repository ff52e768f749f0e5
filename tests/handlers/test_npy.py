"""`.npy` files: a NumPy header is parsed (never evaluated), headerless files read as before."""

import io
import os

import numpy as np
import pytest
from formats import write_flat
from hypothesis import given, settings
from hypothesis import strategies as st

from fmsdata.errors import ConfigError, ShardFormatError
from fmsdata.handlers import FlatTokensHandler
from fmsdata.handlers.npy_header import has_npy_magic, parse_npy_header, read_npy_header

DOCS = [np.arange(100 * i + 2, 100 * i + 2 + 3 + i % 5) for i in range(9)]
EOS = 1


def saved(array, version=None):
    out = io.BytesIO()
    np.lib.format.write_array(out, array, version=version, allow_pickle=False)
    return out.getvalue()


def stream(docs, dtype):
    return np.concatenate([np.append(d, EOS) for d in docs]).astype(dtype)


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
@pytest.mark.parametrize("dtype", ["<u2", "<u4", ">u4", "<i8"])
@pytest.mark.parametrize("shape", [(0,), (7,), (3, 4)])
def test_header_matches_numpy(version, dtype, shape, tmp_path):
    array = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    data = saved(array, version)
    header = parse_npy_header(data, "x.npy")
    assert (header.dtype, header.shape, header.fortran_order) == (array.dtype, shape, False)
    assert data[header.offset :] == array.tobytes() and header.nbytes == array.nbytes
    header.check_size(len(data), "x.npy")
    (tmp_path / "x.npy").write_bytes(data)
    assert read_npy_header(str(tmp_path / "x.npy")) == header
    fortran = parse_npy_header(saved(np.asfortranarray(array), version), "x.npy")
    assert fortran.fortran_order == (len(shape) > 1)


def _with_header(text, version=1):
    body = text.encode("latin1")
    size = len(body).to_bytes(2 if version == 1 else 4, "little")
    return b"\x93NUMPY" + bytes([version, 0]) + size + body


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\x93NUMPY\x04\x00" + b"\x00" * 20, "version 4.0"),
        (b"\x93NUMPY\x01", "truncated .npy header"),
        (_with_header("{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }")[:40], "needs"),
        (_with_header("[1, 2]"), "exactly"),
        (_with_header("{'descr': '<u2', 'shape': (3,)}"), "exactly"),
        (_with_header("{'descr': '<u2', 'fortran_order': 0, 'shape': (3,)}"), "fortran_order 0"),
        (_with_header("{'descr': '<u2', 'fortran_order': False, 'shape': (-3,)}"), "shape"),
        (_with_header("{'descr': '<u2', 'fortran_order': False, 'shape': 3}"), "shape"),
        (_with_header("{'descr': 'O', 'fortran_order': False, 'shape': (3,)}"), "objects"),
        (_with_header("{'descr': '<zz', 'fortran_order': False, 'shape': (3,)}"), "descr"),
        (
            _with_header("{'descr': __import__('os').system('touch pwned'), 'shape': 1}"),
            "not a dict literal",
        ),
        (b"\x93NUMPY\x01\x00" + (60000).to_bytes(2, "little") + b"{", "needs 60010 bytes"),
        (_with_header("{'descr': '<u2', 'fortran_order': False, 'shape': (3,)}", 2)[:-1], "needs"),
    ],
)
def test_malformed_headers_name_the_file(data, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ShardFormatError, match=rf"bad\.npy: .*{message}"):
        parse_npy_header(data, "bad.npy")
    assert not (tmp_path / "pwned").exists()


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=200))
def test_any_bytes_after_the_magic_parse_or_raise_the_typed_error(data):
    raw = b"\x93NUMPY" + data
    try:
        header = parse_npy_header(raw, "f.npy")
    except ShardFormatError as err:
        assert str(err).startswith("f.npy: ")
    else:
        assert not header.dtype.hasobject and header.offset <= len(raw)


DTYPES = st.sampled_from(
    ["<u1", "|i1", "<u2", ">i2", "<u4", ">u4", "<i8", ">i8", "<f2", "<f4", ">f8", "<c16", "?"]
    + ["|S3", "<U5", "|V4", "<M8[s]", "<m8[ns]"]
)
STRUCTURED = st.sampled_from(
    [
        [("a", "<i4"), ("b", ">f8")],
        [("x", "<u2", (2, 3)), ("name", "|S7")],
        [("outer", [("in'ner", "<i2"), ('q"uote', "<u8")]), ("é", "<f4")],
        {"names": ["a", "b"], "formats": ["<i4", "<i4"], "offsets": [0, 8], "itemsize": 16},
    ]
)


@settings(max_examples=200, deadline=None)
@given(
    dtype=st.one_of(DTYPES, STRUCTURED),
    shape=st.lists(st.integers(0, 6), max_size=4).map(tuple),
    fortran=st.booleans(),
    version=st.sampled_from([None, (1, 0), (2, 0), (3, 0)]),
)
def test_header_parser_agrees_with_numpy_on_what_np_save_writes(dtype, shape, fortran, version):
    """Every header ``np.save`` writes parses to the dtype, shape and order numpy reads back."""
    dtype = np.dtype(dtype)
    array = np.zeros(shape, dtype=dtype, order="F" if fortran else "C")
    try:
        data = saved(array, version)
    except ValueError:  # a version that cannot hold this header (non-latin1 names in 1.0/2.0)
        return
    header = parse_npy_header(data, "x.npy")
    loaded = np.load(io.BytesIO(data), allow_pickle=False)
    written = np.lib.format.header_data_from_array_1_0(array)
    assert (header.dtype, header.shape) == (loaded.dtype, loaded.shape)
    assert header.fortran_order == written["fortran_order"]
    assert header.offset == len(data) - array.nbytes and header.nbytes == array.nbytes


def test_header_parsing_does_not_use_ast(monkeypatch):
    """``ast.literal_eval`` once failed in DataLoader workers with an untyped SystemError."""
    import ast

    def broken(*args, **kwargs):
        raise SystemError("AST constructor recursion depth mismatch")

    monkeypatch.setattr(ast, "literal_eval", broken)
    monkeypatch.setattr(ast, "parse", broken)
    header = parse_npy_header(saved(np.arange(5, dtype="<u4")), "x.npy")
    assert (header.dtype, header.shape) == (np.dtype("<u4"), (5,))


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "no literal at character 0"),
        ("{'descr': '<u2', 'fortran_order': False, 'shape': (3,)", "expected ',' or '}'"),
        ("{'descr': '<u2' 'fortran_order': False, 'shape': (3,)}", "expected ',' or '}'"),
        ("{'descr': '<u2', 'fortran_order': False, 'shape': (3,)} x", "text after the literal"),
        ("{'descr': '<u2', 'fortran_order': None, 'shape': (3,)}", "unexpected 'None'"),
        ("{'descr': '<u2', 'fortran_order': Truex, 'shape': (3,)}", "unexpected 'Truex'"),
        ("{'descr': '<u2', 'fortran_order': False, 'shape': (3.0,)}", r"expected ',' or '\)'"),
        ("{'descr': '<u2', 'fortran_order': False, 'shape': (03,)}", "malformed integer"),
        ("{'descr': '<u2', 'fortran_order': False, 'shape': (,)}", "unexpected ','"),
        ("{'descr': '<u2, 'fortran_order': False, 'shape': (3,)}", "expected ',' or '}'"),
        ("{'descr': '<u2', 'fortran_order': False, 'shape': (3,), 'descr': '<u2'}", "twice"),
        ("{descr: '<u2', 'fortran_order': False, 'shape': (3,)}", "key that is not a string"),
        ("{'descr': '\\q', 'fortran_order': False, 'shape': (3,)}", "unknown escape"),
        ("{'descr': '\\x4', 'fortran_order': False, 'shape': (3,)}", "malformed \\\\x"),
        ("{'descr': '<u2", "unterminated string"),
        ("{'descr': " + "[" * 40 + "]" * 40 + "}", "nesting deeper than 32"),
        ("{'descr': dict(), 'fortran_order': False, 'shape': (3,)}", "unexpected 'dict'"),
        ("{'descr': '<u2', 'fortran_order': False, 'shape': {3}}", "key that is not a string"),
    ],
)
def test_malformed_header_literals_say_where(text, reason):
    with pytest.raises(ShardFormatError, match=rf"bad\.npy: \.npy header is not a dict .*{reason}"):
        parse_npy_header(_with_header(text), "bad.npy")


def test_header_strings_take_the_escapes_repr_writes():
    names = ["a'b", 'c"d', "e\\f", "tab\there", "\x00nul", "\u20ac", "\U0001f600"]
    dtype = np.dtype([(name, "<u1") for name in names])
    header = parse_npy_header(saved(np.zeros(2, dtype), (3, 0)), "x.npy")
    assert header.dtype == dtype and header.dtype.names == tuple(names)


def test_magic_is_recognised_by_bytes_not_extension():
    assert has_npy_magic(saved(np.zeros(3, np.uint16)))
    assert not has_npy_magic(np.zeros(3, np.uint16).tobytes())
    assert not has_npy_magic(b"\x93NUM")


def read_all(handler, path):
    reader = handler.open(str(path))
    return [handler.get(reader, i).tolist() for i in range(handler.num_docs(reader))]


def expected(docs):
    return [np.append(d, EOS).tolist() for d in docs]


@pytest.mark.parametrize("dtype", ["<u2", "<u4", "<i8", ">u4"])
def test_np_save_files_read_through_their_header(dtype, tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, stream(DOCS, dtype))
    assert read_all(FlatTokensHandler(separator=EOS, cache_dir=str(tmp_path / "c")), path) == (
        expected(DOCS)
    )
    agreeing = FlatTokensHandler(
        token_dtype=np.dtype(dtype).name, separator=EOS, cache_dir=str(tmp_path / "c2")
    )
    assert read_all(agreeing, path) == expected(DOCS)


def test_a_conflicting_token_dtype_names_both(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, stream(DOCS, "<u4"))
    handler = FlatTokensHandler(token_dtype="uint16", separator=EOS, cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"a\.npy: token_dtype is uint16 .* says uint32"):
        handler.open(str(path))
    (tmp_path / "a.npy.json").write_text('{"dtype": "int8"}')
    with pytest.raises(ConfigError, match=r"a\.npy\.json is int8 .* says uint32"):
        FlatTokensHandler(separator=EOS, cache_dir=str(tmp_path)).open(str(path))


@pytest.mark.parametrize("cut", [1, 2, 7, 64])
def test_a_cut_np_save_file_is_a_truncation(cut, tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, stream(DOCS, "<u4"))
    path.write_bytes(path.read_bytes()[:-cut])
    with pytest.raises(ShardFormatError, match=r"a\.npy: truncated \.npy file"):
        FlatTokensHandler(separator=EOS, cache_dir=str(tmp_path)).open(str(path))
    path.write_bytes(path.read_bytes()[:70])  # inside the header
    with pytest.raises(ShardFormatError, match=r"a\.npy: truncated \.npy header"):
        FlatTokensHandler(separator=EOS, cache_dir=str(tmp_path)).open(str(path))


@pytest.mark.parametrize("dtype, bad", [("<f4", "not an integer"), ("O", "objects")])
def test_non_token_arrays_are_refused(dtype, bad, tmp_path):
    path = tmp_path / "a.npy"
    array = np.arange(6).astype(dtype)
    np.save(path, array, allow_pickle=True)
    with pytest.raises(ShardFormatError, match=rf"a\.npy: .*{bad}"):
        FlatTokensHandler(separator=EOS, cache_dir=str(tmp_path)).open(str(path))


def test_fortran_ordered_matrices_are_refused(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.asfortranarray(np.arange(12, dtype=np.uint16).reshape(3, 4)))
    with pytest.raises(ShardFormatError, match="Fortran order"):
        FlatTokensHandler(separator=EOS, cache_dir=str(tmp_path)).open(str(path))


def test_headerless_npy_reads_exactly_as_before(tmp_path):
    """OLMo/Dolma `.npy` files are raw token streams: no header, type from the config."""
    write_flat(tmp_path, {"d": [DOCS]}, eos=EOS)
    path = tmp_path / "d" / "part_000.npy"
    assert path.read_bytes() == stream(DOCS, "<u2").tobytes()
    handler = FlatTokensHandler(token_dtype="uint16", separator=EOS, cache_dir=str(tmp_path))
    assert read_all(handler, path) == expected(DOCS)
    with pytest.raises(ConfigError, match=r"part_000\.npy: set token_dtype"):
        FlatTokensHandler(separator=EOS, cache_dir=str(tmp_path)).open(str(path))
    path.write_bytes(stream(DOCS, "<u2").tobytes()[:-1])
    with pytest.raises(ShardFormatError, match=r"truncated: .* 1 byte\(s\) of a cut one"):
        handler.open(str(path))


@pytest.mark.parametrize("order", ["C", "F"])
def test_load_npy_reads_what_np_save_wrote_without_ast(tmp_path, monkeypatch, order):
    """fmsdata's own .npy caches are read without ``np.load`` (whose header parse uses
    ``ast``, the CPython 3.11 worker race); a cut file is a ShardFormatError naming it."""
    import ast

    from fmsdata.handlers.npy_header import load_npy

    array = (
        np.asfortranarray(np.arange(12, dtype="<i8").reshape(3, 4))
        if order == "F"
        else (np.arange(12, dtype="<u4").reshape(3, 4))
    )
    path = str(tmp_path / "a.npy")
    np.save(path, array)

    def broken(*args, **kwargs):
        raise SystemError("AST constructor recursion depth mismatch")

    monkeypatch.setattr(ast, "literal_eval", broken)
    monkeypatch.setattr(ast, "parse", broken)
    loaded = load_npy(path)
    assert loaded.dtype == array.dtype and (loaded == array).all()
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) - 8)
    with pytest.raises(ShardFormatError, match="a.npy"):
        load_npy(path)
