"""Buffered lines in their saved form: rebuilt exactly from the files, refused when damaged."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fmsdata.errors import StateMismatchError
from fmsdata.stages.documents import Decoration
from fmsdata.stages.savedlines import (
    COLUMNS,
    DocumentLengths,
    pack_lines,
    resolve,
    unpack_lines,
)
from fmsdata.stages.spans import BASE, DLEN, DS, LENGTH, SAVED_SPAN_WIDTH, SPAN_WIDTH, START
from fmsdata.state.file import state_from_bytes, state_to_bytes

DECORATION = Decoration(bos=1, eos=2)


class Files:
    """One dataset's files as a ``DatasetAccess`` shows them: raw document lengths (the
    decorated length less BOS/EOS) and where each starts in a flat token buffer."""

    def __init__(self, dlens: list[list[int]]):
        self.dlens = [np.asarray(d, dtype=np.int64) for d in dlens]
        self.num_files = len(dlens)

    def doc_count(self, file):
        return len(self.dlens[file])

    def path(self, file):
        return f"file{file}.arrow"

    def measure(self, file, docs, decoration):
        raw = self.dlens[file][docs] - decoration.extra
        zeros = np.zeros(len(docs), dtype=np.int64)
        return raw, zeros, zeros, 1000 * file + docs


@st.composite
def buffers(draw):
    """Datasets of files of documents, and lines of spans over them: whole documents, the
    rest of a split one (first), a cut one (last), pieces of long ones, some spans with
    their document's length unknown (restored and never measured)."""
    n_ds = draw(st.integers(1, 3))
    corpus = [
        [
            draw(st.lists(st.integers(3, 60), min_size=1, max_size=8))
            for _ in range(draw(st.integers(1, 3)))
        ]
        for _ in range(n_ds)
    ]
    lines = []
    for _ in range(draw(st.integers(0, 12))):
        rows = []
        for _ in range(draw(st.integers(1, 6))):
            ds = draw(st.integers(0, n_ds - 1))
            file = draw(st.integers(0, len(corpus[ds]) - 1))
            doc = draw(st.integers(0, len(corpus[ds][file]) - 1))
            dlen = corpus[ds][file][doc]
            kind = draw(st.sampled_from(["whole", "whole", "rest", "head", "middle"]))
            start = 0 if kind in ("whole", "head") else draw(st.integers(1, dlen - 1))
            end = dlen if kind in ("whole", "rest") else draw(st.integers(start + 1, dlen))
            known = draw(st.booleans()) or kind == "whole"
            rows.append([ds, file, doc, start, end - start, dlen if known else -1, -1])
        lines.append(np.asarray(rows, dtype=np.int64).reshape(-1, SPAN_WIDTH))
    return corpus, lines


def _documents(corpus):
    return DocumentLengths([Files(files) for files in corpus], DECORATION)


def _through_a_file(packed):
    return state_from_bytes(state_to_bytes({"buffer": packed}))["buffer"]


@settings(max_examples=60, deadline=None)
@given(buffers())
def test_lines_come_back_exactly(case):
    corpus, lines = case
    packed = _through_a_file(pack_lines(lines))
    assert set(packed) == {"offsets", *COLUMNS, "tokens"}
    assert all(a.dtype.kind == "u" for a in packed.values())
    restored, open_ = resolve(unpack_lines(packed), _documents(corpus))
    assert not open_ and len(restored) == len(lines)
    for got, want in zip(restored, lines):
        assert np.array_equal(got[:, :SAVED_SPAN_WIDTH], want[:, :SAVED_SPAN_WIDTH])
        dlen = [corpus[ds][file][doc] for ds, file, doc in want[:, :3].tolist()]
        assert got[:, DLEN].tolist() == dlen  # found again, known or not when saved
        assert got[:, BASE].tolist() == (1000 * want[:, 1] + want[:, 2]).tolist()
    # Each line's tokens per dataset, as its spans add up.
    tokens = np.asarray(packed["tokens"], dtype=np.int64)
    for i, line in enumerate(lines):
        for ds in range(tokens.shape[1]):
            assert tokens[i, ds] == line[line[:, DS] == ds, LENGTH].sum()


@settings(max_examples=40, deadline=None)
@given(buffers(), st.data())
def test_lines_read_back_are_saved_again_as_they_were(case, data):
    """A replica holding lines read back, unmeasured, beside measured ones (the main
    process after a resume, in any order) saves the same lines and counts."""
    corpus, lines = case
    packed = _through_a_file(pack_lines(lines))
    saved = unpack_lines(packed)
    again = pack_lines(range(len(saved)), saved)
    for key in packed:
        assert np.array_equal(np.asarray(again[key], np.int64), packed[key].astype(np.int64))
    measured, _ = resolve(saved, _documents(corpus))
    order = data.draw(st.permutations(range(len(lines))))
    fresh = data.draw(st.lists(st.sampled_from(order), unique=True)) if order else []
    mixed = unpack_lines(pack_lines([measured[i] if i in fresh else i for i in order], saved))
    want = [measured[i] for i in order]
    got, open_ = resolve(mixed, _documents(corpus))
    assert not open_
    assert all(np.array_equal(g, w) for g, w in zip(got, want)) and len(got) == len(want)
    assert np.array_equal(mixed.tokens, unpack_lines(pack_lines(want)).tokens)


@settings(max_examples=30, deadline=None)
@given(buffers())
def test_without_the_files_every_length_is_kept(case):
    corpus, lines = case
    packed = pack_lines(lines, to_end=False)
    assert (np.asarray(packed["length"]) > 0).all()
    restored, open_ = resolve(unpack_lines(packed), None)
    assert not open_
    for got, want in zip(restored, lines):
        assert np.array_equal(got[:, :SAVED_SPAN_WIDTH], want[:, :SAVED_SPAN_WIDTH])


def test_most_spans_of_packed_lines_leave_their_length_out():
    # Three lines of 10 over documents of 4: whole documents and one split per line.
    lines = [
        np.array([[0, 0, 0, 0, 4, 4, -1], [0, 0, 1, 0, 4, 4, -1], [0, 0, 2, 0, 2, 4, -1]]),
        np.array([[0, 0, 2, 2, 2, 4, -1], [0, 0, 3, 0, 4, 4, -1], [0, 0, 4, 0, 4, 4, -1]]),
    ]
    packed = pack_lines(lines)
    assert packed["length"].tolist() == [0, 0, 2, 0, 0, 0]
    assert packed["tokens"].tolist() == [[10], [10]]
    assert packed["doc"].dtype == np.uint8


def _packed():
    lines = [
        np.array([[0, 0, 0, 0, 5, 5, -1], [1, 0, 1, 0, 3, 7, -1]]),
        np.array([[1, 1, 2, 4, 3, 7, -1]]),
    ]
    return pack_lines(lines)


def _with(key, change):
    packed = {k: np.asarray(v, dtype=np.int64) for k, v in _packed().items()}
    packed[key] = change(packed[key].copy())
    return packed


def _put(index, value):
    def change(array):
        array[index] = value
        return array

    return change


DAMAGE = {
    "negative doc": (_with("doc", _put(1, -3)), r"^doc\[1\]: must be at least 0, got -3"),
    "dataset past the counts": (_with("ds", _put(2, 5)), r"^ds\[2\]: names dataset 5, past the 2"),
    "missing column": (
        {k: v for k, v in _packed().items() if k != "start"},
        r"^keys missing \['start'\]",
    ),
    "old form": (
        {"spans": np.zeros((3, 5), dtype=np.int64), "offsets": np.array([0, 2, 3])},
        r"^keys missing .*unexpected \['spans'\]",
    ),
    "floats": (
        {**_packed(), "file": np.zeros(3)},
        r"^file: expected integers, got float64",
    ),
    "column of another length": (
        {**_packed(), "start": np.zeros(2, dtype=np.uint8)},
        r"^start: holds 2 spans, ds holds 3",
    ),
    "two-d column": (
        {**_packed(), "doc": np.zeros((3, 1), dtype=np.uint8)},
        r"^doc: must be a 1-d array",
    ),
    "empty line": (
        _with("offsets", lambda a: np.array([0, 0, 3])),
        r"^offsets: must be strictly increasing",
    ),
    "offsets short of the spans": (
        _with("offsets", lambda a: np.array([0, 2])),
        r"^offsets: do not bound the 3 spans",
    ),
    "tokens of a line that has none to the end": (
        _with("tokens", _put((0, 1), 4)),
        r"^tokens\[0\]\[1\]: line 0 holds 3 tokens of dataset 1 in spans of known length",
    ),
    "tokens too few for a span to the end": (
        _with("tokens", _put((0, 0), 0)),
        r"^tokens\[0\]\[0\]: .* 1 span\(s\) to the end .* cannot make 0",
    ),
    "tokens of another line count": (
        _with("tokens", lambda a: a[:1]),
        r"^tokens: holds 1 lines, offsets bound 2",
    ),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_damaged_saved_lines_are_refused_naming_the_field(case):
    packed, message = DAMAGE[case]
    with pytest.raises(StateMismatchError, match=message):
        unpack_lines(packed)


CORPUS = [[[5, 6]], [[7, 7, 9], [4, 4, 7]]]  # dataset -> file -> decorated lengths
REDECORATED = [[[6, 6]], CORPUS[1]]  # its first document one token longer

UNFIT = {
    "file past the dataset": (
        _with("file", _put(2, 4)),
        CORPUS,
        r"^file\[2\]: span \[1, 4, 2, 4, 0\] .* names file 4, past the 2 file\(s\) of its dataset",
    ),
    "document past the file": (
        _with("doc", _put(0, 9)),
        CORPUS,
        r"^doc\[0\]: span \[0, 0, 9, 0, 0\] .* which holds 2",
    ),
    "start past the document": (
        _with("start", _put(0, 6)),
        CORPUS,
        r"^start\[0\]: span \[0, 0, 0, 6, 0\] .* ends past its document, which has 5",
    ),
    "explicit end past the document": (
        _with("start", _put(1, 6)),
        CORPUS,
        r"^start\[1\]: span \[1, 0, 1, 6, 3\] .* ends past its document, which has 7",
    ),
    "a document's length changed": (
        _packed(),
        REDECORATED,
        r"^tokens\[0\]\[0\]: line 0 holds 6 tokens of dataset 0 .* but 5 when it was saved",
    ),
}


@pytest.mark.parametrize("case", sorted(UNFIT))
def test_lines_that_do_not_fit_the_files_are_refused(case):
    packed, corpus, message = UNFIT[case]
    with pytest.raises(StateMismatchError, match=message):
        resolve(unpack_lines(packed), _documents(corpus))


def test_lines_of_a_dataset_not_here_stay_open():
    saved = unpack_lines(_packed())
    lines, open_ = resolve(saved, _documents(CORPUS[:1]))
    assert open_
    assert lines[0][0, LENGTH] == 5 and lines[0][1, LENGTH] == 3  # explicit: kept
    assert lines[1][0, START] == 4 and lines[1][0, LENGTH] == 0  # to the end: unknown


def test_a_negative_field_is_saved_as_is_and_refused_when_read():
    packed = pack_lines([np.array([[0, 0, -2, 0, 3, 5, -1]])])
    assert packed["doc"].dtype == np.int64  # not wrapped around into an unsigned type
    with pytest.raises(StateMismatchError, match=r"^doc\[0\]: must be at least 0, got -2"):
        unpack_lines(packed)
