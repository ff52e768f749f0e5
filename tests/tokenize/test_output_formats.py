"""tokenize --format flat|pbin|mds: each read back token for token by its own ecosystem's
reader where one installs here, by fmsdata's handlers and by get_dataset, against the
tokenizer's encoding of the input texts; the tokenizer travels with the root."""

import json
import os
import pickle

import numpy as np
import pytest
from formats import _mds_writer_class

import fmsdata
from fmsdata.cli.main import main
from fmsdata.handlers import make_handler
from fmsdata.handlers.text import TextTokenizer
from fmsdata.tokenize import TokenizeSpec, run_tokenize
from fmsdata.tokenize.writers import write_pbin

EOS = 1  # <|eos|> of the bundled tokenizer


@pytest.fixture(scope="module")
def written(tmp_path_factory, texts, tokenizer):
    """One tokenize output per format, of the same input: ``(roots, encoded documents)``."""
    base = tmp_path_factory.mktemp("formats")
    raw = base / "raw"
    raw.mkdir()
    with open(raw / "a.jsonl", "w", encoding="utf-8") as out:
        for text in texts[:150]:
            out.write(json.dumps({"text": text}) + "\n")
    roots = {}
    for fmt in ("flat", "pbin", "mds", "arrow"):
        roots[fmt] = str(base / fmt)
        spec = TokenizeSpec(roots[fmt], "docs", tokenizer, shard_bytes=12_000, output_format=fmt)
        assert run_tokenize(spec, [str(raw)]).complete
    docs = [d for d in TextTokenizer(tokenizer).encode(texts[:150]) if d]
    return roots, docs


def shards(root, ending):
    folder = os.path.join(root, "docs")
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(ending))


def test_flat_is_tatm_and_olmo_layout(written):
    roots, docs = written
    expected = np.concatenate([np.append(d, EOS) for d in docs])
    files = shards(roots["flat"], ".bin")
    assert len(files) > 2
    # What tatm's TokenMemMapArray and OLMo's MemMapDataset do: a raw memmap per file.
    sidecars = [json.load(open(f + ".json")) for f in files]
    assert {s["dtype"] for s in sidecars} == {"uint16"}
    got = np.concatenate([np.memmap(f, dtype=np.uint16, mode="r") for f in files])
    assert np.array_equal(got, expected)
    meta = json.load(open(os.path.join(roots["flat"], "metadata.json")))
    info = meta["tokenized_info"]
    assert info["file_prefix"].endswith("docs/shard-") and info["dtype"] == "uint16"
    entry = meta["datasets"]["docs"]
    assert entry["documents_end_with_eos"] and entry["eos_token"] == EOS
    assert entry["tokens"] == len(expected)


def test_pbin_reads_back_as_modalities_does(written):
    """Modalities' own reader (``EmbeddedStreamData``) does not import here (it needs jq,
    pydantic and transformers beside the pinned torch); this follows its code: header
    fields, a memmap of the data section, and ``pickle.loads`` of the trusted index."""
    roots, docs = written
    got = []
    for path in shards(roots["pbin"], ".pbin"):
        raw = open(path, "rb").read()
        data_len = int.from_bytes(raw[:8], "little")
        token_size = int.from_bytes(raw[8:12], "little")
        index = pickle.loads(raw[12 + data_len :])  # our own file, written just now
        data = np.frombuffer(raw[12 : 12 + data_len], dtype={2: np.uint16}[token_size])
        got.extend(data[o // 2 : (o + n) // 2] for o, n in index)
    assert len(got) == len(docs)
    for doc, tokens in zip(docs, got):
        assert tokens.tolist() == doc + [EOS]


def test_mds_reads_back_with_streaming(written):
    _mds_writer_class()  # streaming's modules, imported without its package __init__
    from streaming.base.format.mds.reader import MDSReader

    roots, docs = written
    folder = os.path.join(roots["mds"], "docs")
    index = json.load(open(os.path.join(folder, "index.json")))
    got = []
    for entry in index["shards"]:
        reader = MDSReader.from_json(folder, None, entry)
        got.extend(
            reader.decode_sample(reader.get_sample_data(i))["tokens"]
            for i in range(entry["samples"])
        )
    assert [g.tolist() for g in got] == docs
    assert {g.dtype.name for g in got} == {"uint16"}


@pytest.mark.parametrize("fmt", ["flat", "pbin", "mds"])
def test_fmsdata_reads_every_format_back(written, fmt):
    roots, docs = written
    handler = make_handler({"flat": "npy", "pbin": "pbin", "mds": "mds"}[fmt], separator=EOS)
    got = []
    for path in handler.select(shards(roots[fmt], "")):
        reader = handler.open(path)
        got.extend(handler.get(reader, i).tolist() for i in range(handler.num_docs(reader)))
    with_eos = fmt != "mds"
    assert got == [d + [EOS] if with_eos else d for d in docs]
    # get_dataset: the same stream whatever the format, with the bundled tokenizer.
    windows = {}
    for name, root in roots.items():
        ds = fmsdata.get_dataset(root, 50)
        assert ds.vocab_size == 4096 and ds.eos_token == EOS
        windows[name] = np.stack([ds[i]["token_ids"].numpy() for i in range(len(ds))])
    assert all(np.array_equal(w, windows["arrow"]) for w in windows.values())


def test_tokenizer_is_bundled_and_inspect_decodes_with_it(written, texts, capsys, tmp_path):
    roots, _ = written
    for root in roots.values():
        meta = json.load(open(os.path.join(root, "metadata.json")))
        bundled = os.path.join(root, meta["tokenizer"]["file"])
        assert not os.path.isabs(meta["tokenizer"]["file"]) and os.path.isfile(bundled)
    moved = tmp_path / "moved"
    os.rename(roots["flat"], moved)  # relative: the root can move
    try:
        for target in (moved, moved / "docs", moved / "docs" / "shard-00000.bin"):
            assert main(["inspect", str(target), "--samples", "1"]) == 0
            out = capsys.readouterr().out
            assert texts[0][:40] in out
    finally:
        os.rename(moved, roots["flat"])


def test_cli_formats_and_eos(tmp_path, tokenizer, capsys):
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps({"text": "hello there"}) + "\n")
    out = tmp_path / "out"
    argv = ["tokenize", str(raw), "--tokenizer", tokenizer, "--output-dir", str(out)]
    assert main([*argv, "--format", "flat", "--eos-token", "7"]) == 0
    data = np.fromfile(out / "default" / "shard-00000.bin", np.uint16)
    assert data[-1] == 7 and (data == 7).sum() == 1
    write_pbin(str(tmp_path / "x.pbin"), [np.array([5, 6])], 9, np.uint16)
    assert make_handler("pbin").get(
        make_handler("pbin").open(str(tmp_path / "x.pbin")), 0
    ).tolist() == [5, 6, 9]
