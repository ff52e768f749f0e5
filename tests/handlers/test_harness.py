"""Corruption harness over every format fmsdata reads.

Each example damages one pristine shard (written by the writers of ``tests/formats.py``)
and reads it back through its handler. The outcome must be a ``ShardFormatError`` naming
the file, or the writer's documents exactly. Never other tokens, never another exception.

Damage: a cut at any offset; a flipped byte where the format keeps structure (headers,
indexes, footers, compressed framing); an index or offset entry overwritten with another
value. Where a format carries no length or checksum at all, what it cannot detect is
spelled out (and asserted to be no worse): a headerless token stream or plain JSON lines
cut at a document boundary read as fewer documents, and a moved boundary in Arrow list
offsets re-splits the same tokens (``concatenation`` below). Token bytes themselves are
never flipped: no format without checksums can tell.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable

import numpy as np
import pytest
from formats import (
    pbin_bytes,
    write_arrow,
    write_flat,
    write_hf_arrow,
    write_jsonl,
    write_mds,
    write_megatron_fmsdata,
    write_parquet_tokens,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fmsdata.errors import ShardFormatError
from fmsdata.handlers import make_handler
from fmsdata.handlers.text import TextTokenizer
from fmsdata.util.textcorpus import bundled_tokenizer_path

EOS = 1
DOCS = [np.arange(40 * i + 3, 40 * i + 3 + 2 + (7 * i) % 9, dtype=np.uint16) for i in range(10)]
TEXTS = [f"record {i}: {'words ' * (i % 4)}end" for i in range(10)]
EXAMPLES = int(os.environ.get("FMSDATA_HARNESS_EXAMPLES", "40"))  # more: a deeper search


@dataclasses.dataclass
class Shard:
    """A pristine shard: its files' bytes, the path handed to the handler, the handler
    options, the expected documents and the regions where its structure lives."""

    files: dict[str, bytes]
    main: str
    options: dict
    docs: list[list[int]]
    structure: Callable[[str, bytes], list[tuple[int, int]]]  # [start, end) byte ranges
    entries: Callable[[str, bytes], list[tuple[int, int]]]  # (offset, width) of index words
    framed: bool = True  # a cut is always detectable (a length or an end marker exists)
    boundaries: bool = True  # a moved document boundary is detectable


def _files(root: str) -> dict[str, bytes]:
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as handle:
                found[os.path.relpath(path, root)] = handle.read()
    return found


def _nothing(name, data):
    return []


def _words(width):
    def entries(name, data):
        return [(at, width) for at in range(0, len(data) - width + 1, width)]

    return entries


def _parquet_footer(name, data):
    return [(len(data) - 8 - int.from_bytes(data[-8:-4], "little"), len(data))]


def _idx_all(name, data):
    return [(0, len(data))] if name.endswith(".idx") else []


def _idx_words(name, data):
    return _words(4)(name, data) if name.endswith(".idx") else []


def _arrow_structure(name, data):
    """Arrow IPC: everything but the token buffers (found by their bytes)."""
    regions, at = [], 0
    for doc in DOCS:
        found = data.find(doc.tobytes(), at)
        if found >= 0:
            regions.append((at, found))
            at = found + doc.nbytes
    return regions + [(at, len(data))]


def _hf_offsets(name, data):
    """The int32 list offsets of each record batch (written 8 rows at a time)."""
    entries = []
    for first in range(0, len(DOCS), 8):
        batch = DOCS[first : first + 8]
        offsets = np.cumsum([0] + [len(d) for d in batch]).astype(np.int32).tobytes()
        at = data.find(offsets)
        entries += [(at + 4 * k, 4) for k in range(len(batch) + 1)]
    return entries


def _mds_structure(name, data):
    if not name.endswith(".mds"):
        return [(0, len(data))] if name.endswith("index.json") else []
    n = int(np.frombuffer(data[:4], np.uint32)[0])
    return [(0, int(np.frombuffer(data[4:8], np.uint32)[0]))] if n else [(0, len(data))]


def _mds_entries(name, data):
    if not name.endswith(".mds"):
        return []
    n = int(np.frombuffer(data[:4], np.uint32)[0])
    return [(at, 4) for at in range(0, 4 * (n + 2), 4)]


def _npy_structure(name, data):
    return [(0, data.index(b"\n") + 1)]  # magic, version, length and the header dict


def _pbin_structure(name, data):
    tail = 12 + int(np.frombuffer(data[:8], np.uint64)[0])
    return [(0, 12), (tail, len(data))]


def _gzip_all(name, data):
    return [(0, len(data))]  # CRC32 and length cover every byte


def _zstd_framing(name, data):
    return [(0, 6)]  # magic and frame header; blocks without a checksum are not covered


def _tokens(texts):
    return [list(ids) for ids in TextTokenizer(bundled_tokenizer_path()).encode(texts)]


def build(kind: str) -> Shard:
    root = tempfile.mkdtemp(prefix=f"harness-{kind}-")
    try:
        docs = [d.tolist() for d in DOCS]
        tokens = {"d": [DOCS]}
        if kind == "arrow":
            write_arrow(root, tokens)
            shard = Shard({}, "d/part_000.arrow", {}, docs, _arrow_structure, _nothing)
        elif kind in ("hf_arrow", "hf_arrow_file"):
            write_hf_arrow(root, tokens, file_format=kind == "hf_arrow_file")
            shard = Shard(
                {},
                "d/part_000.arrow",
                {"file_type": "hf_arrow", "col_name": "input_ids"},
                docs,
                _arrow_structure,
                _hf_offsets,
                boundaries=False,
            )
        elif kind == "parquet":
            write_parquet_tokens(root, tokens)
            shard = Shard({}, "d/part_000.parquet", {}, docs, _parquet_footer, _nothing)
        elif kind == "megatron":
            write_megatron_fmsdata(root, tokens)
            # Documents list their first sequence (doc_idx): a moved one re-splits the tokens.
            shard = Shard({}, "d/part_000.idx", {}, docs, _idx_all, _idx_words, boundaries=False)
        elif kind == "pbin":
            os.makedirs(os.path.join(root, "d"))
            with open(os.path.join(root, "d", "part_000.pbin"), "wb") as out:
                out.write(pbin_bytes(DOCS, EOS))
            shard = Shard(
                {},
                "d/part_000.pbin",
                {},
                [d + [EOS] for d in docs],
                _pbin_structure,
                _nothing,  # index entries: patched through the pickle in test_pbin_index_patches
            )
        elif kind == "flat":
            write_flat(root, tokens, eos=EOS)
            shard = Shard(
                {},
                "d/part_000.npy",
                {"token_dtype": "uint16"},
                [d + [EOS] for d in docs],
                _nothing,
                _nothing,
                framed=False,
            )
        elif kind == "npy":
            os.makedirs(os.path.join(root, "d"))
            stream = np.concatenate([np.append(d, EOS) for d in DOCS]).astype(np.uint16)
            np.save(os.path.join(root, "d", "part_000.npy"), stream)
            shard = Shard(
                {}, "d/part_000.npy", {}, [d + [EOS] for d in docs], _npy_structure, _nothing
            )
        elif kind.startswith("jsonl"):
            compression = {"jsonl": None, "jsonl_gz": "gz", "jsonl_zst": "zst"}[kind]
            write_jsonl(root, {"d": [TEXTS]}, compression=compression)
            suffix = {None: ".jsonl", "gz": ".jsonl.gz", "zst": ".jsonl.zst"}[compression]
            structure = {None: _nothing, "gz": _gzip_all, "zst": _zstd_framing}[compression]
            shard = Shard(
                {},
                "d/part_000" + suffix,
                {"file_type": "jsonl", "strict": True},
                _tokens(TEXTS),
                structure,
                _nothing,
                framed=compression is not None,
            )
        elif kind in ("mds", "mds_zstd"):
            compression = "zstd" if kind == "mds_zstd" else None
            write_mds(root, tokens, compression=compression)
            name = "d/shard.00000.mds" + (".zstd" if compression else "")
            structure = _mds_structure if not compression else _zstd_framing
            entries = _mds_entries if not compression else _nothing
            shard = Shard({}, name, {"token_dtype": "uint16"}, docs, structure, entries)
        else:
            raise ValueError(kind)
        shard.files = _files(root)
        return shard
    finally:
        shutil.rmtree(root)


KINDS = [
    "arrow",
    "hf_arrow",
    "hf_arrow_file",
    "parquet",
    "megatron",
    "pbin",
    "flat",
    "npy",
    "jsonl",
    "jsonl_gz",
    "jsonl_zst",
    "mds",
    "mds_zstd",
]
# Kinds whose shards keep structure (headers, indexes, footers, framing) to flip a byte in,
# and kinds with index words to overwrite; the others are covered by the cut test alone
# (a headerless stream and plain JSON lines have neither). A kind listed here whose shard
# then offers nothing fails, rather than passing having checked nothing.
STRUCTURED_KINDS = [kind for kind in KINDS if kind not in ("flat", "jsonl")]
INDEXED_KINDS = ["hf_arrow", "hf_arrow_file", "megatron", "mds"]
_SHARDS: dict[str, Shard] = {}


def shard_of(kind: str) -> Shard:
    if kind not in _SHARDS:
        _SHARDS[kind] = build(kind)
    return _SHARDS[kind]


def read_back(shard: Shard, files: dict[str, bytes]) -> list[list[int]] | None:
    """Write ``files``, read the shard: its documents, or None after a ShardFormatError
    that names one of its files. Any other exception fails the test."""
    with tempfile.TemporaryDirectory(prefix="harness-") as root:
        for name, data in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
            with open(os.path.join(root, name), "wb") as out:
                out.write(data)
        options = {"file_type": "auto", "col_name": "tokens", **shard.options}
        handler = make_handler(
            options.pop("file_type"),
            separator=EOS,
            tokenizer=bundled_tokenizer_path(),
            cache_dir=os.path.join(root, "cache"),
            **options,
        )
        path = os.path.join(root, shard.main)
        try:
            reader = handler.open(path)
            try:
                n = handler.num_docs(reader)
                docs = [np.asarray(handler.get(reader, i)).tolist() for i in range(n)]
                lengths = handler.doc_lengths(reader, np.arange(n, dtype=np.int64)).tolist()
            finally:
                handler.close(reader)
        except ShardFormatError as err:
            names = [os.path.basename(name) for name in files]
            assert any(name in str(err) for name in names), f"no file named in: {err}"
            return None
        assert lengths == [len(d) for d in docs], "doc_lengths disagrees with get"
        return docs


def concatenation(docs: list[list[int]]) -> list[int]:
    return [t for d in docs for t in d]


def check(shard: Shard, damaged: dict[str, bytes], *, framed: bool, boundaries: bool) -> None:
    docs = read_back(shard, damaged)
    if docs is None or docs == shard.docs:
        return
    if not boundaries and concatenation(docs) == concatenation(shard.docs):
        return  # a moved boundary in a format that records only boundaries
    if not framed:  # a cut no length records: whole documents, then a prefix of the next
        assert len(docs) <= len(shard.docs)
        if docs:
            assert docs[:-1] == shard.docs[: len(docs) - 1]
            assert docs[-1] == shard.docs[len(docs) - 1][: len(docs[-1])]
        return
    pytest.fail(f"damaged shard read as other documents: {docs} (expected {shard.docs})")


@pytest.mark.parametrize("kind", KINDS)
def test_pristine_shards_read_exactly(kind):
    shard = shard_of(kind)
    assert read_back(shard, shard.files) == shard.docs


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_cut_anywhere(kind, data):
    shard = shard_of(kind)
    name = data.draw(st.sampled_from(sorted(shard.files)), label="file")
    size = len(shard.files[name])
    keep = data.draw(st.integers(0, size - 1), label="keep")
    damaged = {**shard.files, name: shard.files[name][:keep]}
    # A cut JSON index never parses: detectable whatever the shard's own framing.
    check(shard, damaged, framed=shard.framed or name.endswith(".json"), boundaries=True)


@pytest.mark.parametrize("kind", STRUCTURED_KINDS)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_flipped_structure_byte(kind, data):
    shard = shard_of(kind)
    regions = [
        (name, start, end)
        for name in sorted(shard.files)
        for start, end in shard.structure(name, shard.files[name])
        if end > start
    ]
    assert regions, f"{kind} shard offers no structure region to damage"
    name, start, end = data.draw(st.sampled_from(regions), label="region")
    at = data.draw(st.integers(start, end - 1), label="at")
    bit = data.draw(st.integers(0, 7), label="bit")
    damaged = bytearray(shard.files[name])
    damaged[at] ^= 1 << bit
    check(shard, {**shard.files, name: bytes(damaged)}, framed=True, boundaries=shard.boundaries)


@pytest.mark.parametrize("kind", INDEXED_KINDS)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_patched_index_entry(kind, data):
    shard = shard_of(kind)
    entries = [
        (name, at, width)
        for name in sorted(shard.files)
        for at, width in shard.entries(name, shard.files[name])
    ]
    assert entries, f"{kind} shard offers no index entry to overwrite"
    name, at, width = data.draw(st.sampled_from(entries), label="entry")
    old = int.from_bytes(shard.files[name][at : at + width], "little", signed=True)
    value = data.draw(
        st.one_of(
            st.integers(old - 3, old + 3),
            st.integers(-(1 << (8 * width - 1)), (1 << (8 * width - 1)) - 1),
        ),
        label="value",
    )
    damaged = bytearray(shard.files[name])
    damaged[at : at + width] = value.to_bytes(width, "little", signed=True)
    check(shard, {**shard.files, name: bytes(damaged)}, framed=True, boundaries=shard.boundaries)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_pbin_index_patches(data):
    """The .pbin index is a pickled list of (offset, length) pairs: patch one number."""
    shard = shard_of("pbin")
    pairs = []
    at = 0
    for doc in DOCS:
        pairs.append([at, 2 * (len(doc) + 1)])
        at += 2 * (len(doc) + 1)
    row = data.draw(st.integers(0, len(pairs) - 1), label="row")
    column = data.draw(st.integers(0, 1), label="column")
    old = pairs[row][column]
    pairs[row][column] = data.draw(
        st.one_of(st.integers(old - 3, old + 3), st.integers(-(1 << 40), 1 << 40)), label="value"
    )
    body = shard.files["d/part_000.pbin"]
    tail = 12 + int(np.frombuffer(body[:8], np.uint64)[0])
    damaged = body[:tail] + pickle.dumps([tuple(p) for p in pairs])
    check(shard, {"d/part_000.pbin": damaged}, framed=True, boundaries=True)


def test_mds_index_json_sample_count(tmp_path):
    shard = shard_of("mds")
    meta = json.loads(shard.files["d/index.json"])
    meta["shards"][0]["samples"] += 1
    assert read_back(shard, {**shard.files, "d/index.json": json.dumps(meta).encode()}) is None
