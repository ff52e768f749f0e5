import gc
import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import accesses, scratch_dir

from fmsdata.data.synthetic import CorpusInfo
from fmsdata.errors import ConfigError, ShardFormatError
from fmsdata.handlers.arrow import write_arrow_docs
from fmsdata.stages.documents import Decoration, RandomWalk
from fmsdata.stages.lineblock import LineBlock
from fmsdata.stages.mixing import TokenShareMixer
from fmsdata.stages.packing import LinePacker
from fmsdata.stages.schedule import WeightSchedule
from fmsdata.stages.spans import BASE, DLEN, restore_spans
from fmsdata.worker.materialize import LineWriter

STRIP = 9
ONE = WeightSchedule.constant([1.0])


def stripped_corpus(root: str, seed: int, dtypes=(np.uint32, np.uint32)) -> CorpusInfo:
    """Documents that sometimes already start or end with token 9 (to be stripped); file
    ``f`` stores its tokens as ``dtypes[f]``."""
    rng = np.random.default_rng(seed)
    files = {}
    next_token = 16
    for f in range(2):
        docs = []
        for _ in range(30):
            n = int(rng.integers(1, 40))
            doc = np.arange(next_token, next_token + n)
            next_token += n
            if rng.random() < 0.3:
                doc = np.concatenate([[STRIP], doc])
            if rng.random() < 0.3:
                doc = np.concatenate([doc, [STRIP]])
            docs.append(doc)
        os.makedirs(os.path.join(root, "a"), exist_ok=True)
        write_arrow_docs(os.path.join(root, "a", f"s{f}.arrow"), docs, dtype=dtypes[f])
        files[f"a/s{f}.arrow"] = (None, None)
    return CorpusInfo(root, {"a": (16, next_token)}, {"a": 60}, files)


def reference_line(spans, path_of, deco, line_length, bol, eol, pad):
    """Tokens of a line computed from pyarrow reads, one document at a time."""
    out = [] if bol is None else [bol]
    for _, f, d, start, n in spans[:, :5].tolist():
        tokens = pa.ipc.open_file(path_of(f)).get_batch(d).column(0).to_numpy().tolist()
        if deco.strip and tokens and tokens[0] in deco.strip:
            tokens = tokens[1:]
        if deco.strip and tokens and tokens[-1] in deco.strip:
            tokens = tokens[:-1]
        decorated = (
            ([deco.bos] if deco.bos is not None else [])
            + tokens
            + ([deco.eos] if deco.eos is not None else [])
        )
        out += decorated[start : start + n]
    if eol is not None:
        out.append(eol)
    filled = len(out)
    return out + [pad] * (line_length - filled), filled


@settings(max_examples=30)
@given(
    bos=st.sampled_from([None, 1]),
    eos=st.sampled_from([None, 2]),
    bol=st.sampled_from([None, 3]),
    eol=st.sampled_from([None, 4]),
    strip=st.booleans(),
    pad_mode=st.booleans(),
    seq=st.integers(8, 90),
    seed=st.integers(0, 30),
    # Each compiled copy per file dtype (same width, narrower, 64-bit checked); two files,
    # so one write copies from two buffers.
    dtypes=st.tuples(*[st.sampled_from([np.uint32, np.int32, np.uint16, np.int64])] * 2),
)
def test_written_lines_match_a_document_by_document_reference(
    bos, eos, bol, eol, strip, pad_mode, seq, seed, dtypes
):
    root = scratch_dir()
    info = stripped_corpus(root, seed, dtypes)
    acc = accesses(info)
    deco = Decoration(bos=bos, eos=eos, strip=frozenset({STRIP}) if strip else frozenset())
    line_length = seq + 1
    capacity = line_length - (bol is not None) - (eol is not None)
    mixer = TokenShareMixer([RandomWalk(acc[0], 0, 1, seed, deco)], ["a"], ONE)
    packer = LinePacker(mixer, capacity, "pad" if pad_mode else "hard")
    lines = [next(packer) for _ in range(12)]
    writer = LineWriter(acc, deco, line_length, bol=bol, eol=eol, pad=5 if pad_mode else None)
    out = np.zeros((len(lines), line_length), dtype=np.int32)
    content = writer.write(lines, out)

    def path_of(f):
        return os.path.join(root, acc[0].path(f))

    for row, line, n in zip(out, lines, content):
        expected, filled = reference_line(line, path_of, deco, line_length, bol, eol, 5)
        assert row.tolist() == expected
        assert n == filled
    # Lines restored from a saved state (document facts unknown) come out the same.
    restored = [restore_spans(line[:, :5]) for line in lines]
    again = np.zeros_like(out)
    writer.write(restored, again)
    assert np.array_equal(again, out)
    # As one block too; the facts are found on a copy: the caller's block is not changed
    # (token stages see a restored span's facts unknown, whichever path wrote its line).
    block = LineBlock.of(restored)
    before = block.spans.copy()
    third = np.zeros_like(out)
    writer.write(block, third)
    assert np.array_equal(third, out) and np.array_equal(block.spans, before)


def test_vocab_check_names_the_file(tmp_path):
    os.makedirs(tmp_path / "a")
    write_arrow_docs(
        str(tmp_path / "a" / "bad.arrow"), [np.arange(20, 30), np.array([20, 70000, 21])]
    )
    info = CorpusInfo(str(tmp_path), {"a": (20, 30)}, {"a": 2}, {"a/bad.arrow": (None, None)})
    acc = accesses(info)
    deco = Decoration()
    packer = LinePacker(
        TokenShareMixer([RandomWalk(acc[0], 0, 1, 0, deco)], ["a"], ONE),
        13,
        "hard",
    )
    writer = LineWriter(acc, deco, 13, vocab_size=50000)
    with pytest.raises(ShardFormatError, match=r"bad\.arrow: document 1 holds token id 70000"):
        writer.write([next(packer)], np.zeros((1, 13), dtype=np.int32))


def test_spans_carry_document_facts(tmp_path):
    info = stripped_corpus(str(tmp_path), 0)
    acc = accesses(info)
    deco = Decoration(bos=1, eos=2, strip=frozenset({STRIP}))
    packer = LinePacker(
        TokenShareMixer([RandomWalk(acc[0], 0, 1, 0, deco)], ["a"], ONE),
        50,
        "hard",
    )
    line = next(packer)
    assert (line[:, DLEN] > 0).all() and (line[:, BASE] >= 0).all()


@pytest.mark.parametrize("dtype", [np.uint32, np.int64])
def test_a_token_that_does_not_fit_an_int32_row_names_the_file_and_document(tmp_path, dtype):
    os.makedirs(tmp_path / "a")
    docs = [np.arange(20, 30), np.array([20, 2**31, 21])]
    write_arrow_docs(str(tmp_path / "a" / "big.arrow"), docs, dtype=dtype)
    info = CorpusInfo(str(tmp_path), {"a": (20, 30)}, {"a": 2}, {"a/big.arrow": (None, None)})
    acc = accesses(info)
    deco = Decoration()
    packer = LinePacker(
        TokenShareMixer([RandomWalk(acc[0], 0, 1, 0, deco)], ["a"], ONE), 13, "hard"
    )
    writer = LineWriter(acc, deco, 13)
    with pytest.raises(
        ShardFormatError,
        match=r"big\.arrow: document 1 holds a token id outside \[0, 2\*\*31\): 2147483648",
    ):
        writer.write([next(packer)], np.zeros((1, 13), dtype=np.int32))


def test_a_delimiter_that_does_not_fit_an_int32_row_is_a_config_error(tmp_path):
    info = stripped_corpus(str(tmp_path), 0)
    with pytest.raises(ConfigError, match=r"eol token 2147483648 does not fit the int32 rows"):
        LineWriter(accesses(info), Decoration(), 13, eol=2**31)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_the_largest_token_id_the_vocabulary_holds_is_kept_and_the_next_refused(tmp_path, dtype):
    """65535 with vocab_size 65536 (a uint16 file skips the check: none of its values can
    exceed the vocabulary) and with 65535 (refused, on the checked copy)."""
    os.makedirs(tmp_path / "a")
    write_arrow_docs(
        str(tmp_path / "a" / "top.arrow"),
        [np.array([20, 65535, 21]), np.arange(22, 40)],
        dtype=dtype,
    )
    info = CorpusInfo(str(tmp_path), {"a": (20, 40)}, {"a": 2}, {"a/top.arrow": (None, None)})
    deco = Decoration()

    def line():
        mixer = TokenShareMixer([RandomWalk(accesses(info)[0], 0, 1, 0, deco)], ["a"], ONE)
        return next(LinePacker(mixer, 21, "hard"))

    rows = np.zeros((1, 21), dtype=np.int32)
    LineWriter(accesses(info), deco, 21, vocab_size=65536).write([line()], rows)
    assert 65535 in rows[0].tolist()
    with pytest.raises(ShardFormatError, match=r"top\.arrow: document 0 holds token id 65535"):
        LineWriter(accesses(info), deco, 21, vocab_size=65535).write([line()], rows)


def test_a_pending_copy_reads_buffers_whose_readers_were_closed(tmp_path):
    """The copy reads buffers by address after lay_out; readers evicted or closed in
    between (a cache of one reader, then closed) unmap nothing it reads: the rows equal a
    copy made while every reader was open."""
    from fmsdata.data.access import ReaderCache

    info = stripped_corpus(str(tmp_path), 3, dtypes=(np.uint16, np.int64))
    deco = Decoration(bos=1, eos=2)

    def lines(acc):
        mixer = TokenShareMixer([RandomWalk(acc[0], 0, 1, 0, deco)], ["a"], ONE)
        packer = LinePacker(mixer, 40, "hard")
        return [next(packer) for _ in range(60)]

    want = np.zeros((60, 40), dtype=np.int32)
    LineWriter(accesses(info), deco, 40).write(lines(accesses(info)), want)
    cache = ReaderCache(1)
    acc = accesses(info, cache=cache)
    got = np.zeros_like(want)
    fill, pending = LineWriter(acc, deco, 40).lay_out(lines(accesses(info)), got)
    assert len(pending.buffers) == 2  # both files, of two dtypes, in one copy
    cache.release()
    cache.close()
    gc.collect()
    pending.copy(got, 0, len(got))
    np.testing.assert_array_equal(got, want)
