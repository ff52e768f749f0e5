"""CEPE's counted .npy layout, written the way its RedPajama prep writes it."""

import numpy as np
import pytest

import fmsdata
from fmsdata.errors import ShardFormatError
from fmsdata.handlers import make_handler

DOCS = [np.arange(100 * k + 3, 100 * k + 3 + n) for k, n in enumerate([2017, 5, 1, 40, 0, 9])]


def cepe_save(path, docs, dtype=np.int64):
    """As CEPE's prep: ``np.save`` of ``[n, *lengths, *tokens]`` (int64 there)."""
    lengths = [len(d) for d in docs]
    np.save(path, np.array([len(docs), *lengths, *np.concatenate(docs)], dtype=dtype))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint16, ">i8"])
def test_reads_back_as_its_documents(tmp_path, dtype):
    path = str(tmp_path / "part.npy")
    cepe_save(path, DOCS, dtype)
    handler = make_handler("cepe")
    reader = handler.open(path)
    assert handler.num_docs(reader) == len(DOCS)
    for k, doc in enumerate(DOCS):
        assert handler.get(reader, k).tolist() == doc.tolist()
    assert handler.doc_lengths(reader, np.arange(len(DOCS))).tolist() == [len(d) for d in DOCS]
    assert handler.count(path) == (len(DOCS), sum(len(d) for d in DOCS))
    # Read as a flat stream, document 0 would begin with the count and the lengths.
    assert handler.get(reader, 0)[:3].tolist() == [3, 4, 5]


def test_get_dataset_over_cepe_files(tmp_path, monkeypatch):
    monkeypatch.setenv("FMSDATA_CACHE", str(tmp_path / "cache"))
    (tmp_path / "root" / "rp").mkdir(parents=True)
    cepe_save(str(tmp_path / "root" / "rp" / "a.npy"), DOCS[:3])
    cepe_save(str(tmp_path / "root" / "rp" / "b.npy"), DOCS[3:])
    ds = fmsdata.get_dataset(str(tmp_path / "root"), 64, file_type="cepe", eos_token=1)
    stream = np.concatenate([np.append(d, 1) for d in DOCS])
    got = np.concatenate([ds[i]["token_ids"].numpy() for i in range(len(ds))])
    assert np.array_equal(got, stream[: len(ds) * 64])


@pytest.mark.parametrize(
    "values, match",
    [
        ([3, 2, 2, 1, 5, 6, 7], r"need 1 \+ 3 \+ 5 = 9 values, the array holds 7"),
        ([2, 2, 2, 1, 5, 6, 7, 8], r"need 1 \+ 2 \+ 4 = 7 values, the array holds 8"),
        ([9, 1, 2], "count 9 does not fit"),
        ([-1], "count -1"),
        ([2, -3, 5, 1], "document 0 has length -3"),
        ([], "no document count"),
    ],
)
def test_count_and_lengths_must_match_the_size(tmp_path, values, match):
    path = str(tmp_path / "bad.npy")
    np.save(path, np.array(values, dtype=np.int64))
    with pytest.raises(ShardFormatError, match=match):
        make_handler("cepe").open(path)


def test_refuses_what_is_not_one_integer_array(tmp_path):
    for name, array in {"f.npy": np.zeros(4), "m.npy": np.zeros((2, 2), np.int64)}.items():
        np.save(tmp_path / name, array)
        with pytest.raises(ShardFormatError, match="1-D integer array"):
            make_handler("cepe").open(str(tmp_path / name))
    (tmp_path / "raw.npy").write_bytes(np.arange(4, dtype=np.int64).tobytes())
    with pytest.raises(ShardFormatError, match="magic"):
        make_handler("cepe").open(str(tmp_path / "raw.npy"))
