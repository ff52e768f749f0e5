"""S1: every token-shard layout through the same pipeline gives the same batches."""

import os

import numpy as np
import pytest
from formats import (
    write_arrow,
    write_flat,
    write_hf_arrow,
    write_jsonl,
    write_mds,
    write_mds_streaming,
    write_megatron_core,
    write_megatron_fmsdata,
    write_parquet_text,
    write_parquet_tokens,
    write_pbin,
)
from support import assert_same_batches, take

from fmsdata import build_dataloader
from fmsdata.handlers.text import TextTokenizer
from fmsdata.util.textcorpus import bundled_tokenizer_path, stdlib_docstrings

EOS = 1  # <|eos|> of the bundled tokenizer


@pytest.fixture(scope="module")
def documents():
    """Texts (two datasets, three files each) and their tokens under the bundled tokenizer."""
    texts = list(stdlib_docstrings(limit=120))
    tokenizer = TextTokenizer(bundled_tokenizer_path())
    chunks = {
        "web": [texts[0:17], texts[17:40], texts[40:58]],
        "code": [texts[58:80], texts[80:99], texts[99:120]],
    }
    tokens = {
        name: [
            [np.asarray(ids, dtype=np.uint16) for ids in tokenizer.encode(chunk)] for chunk in files
        ]
        for name, files in chunks.items()
    }
    return chunks, tokens


def config(root, **overrides):
    base = dict(
        data_path=str(root),
        datasets=["web", "code"],
        weights=[2, 1],
        seq_length=64,
        batch_size=4,
        logical_shards=3,
        shuffle_window=5,
        bos_token=0,
        eos_token=EOS,
        strip_tokens=[EOS],  # flat and .pbin documents carry their own EOS
        tokenizer=bundled_tokenizer_path(),
        token_dtype="uint16",
        num_workers=1,
    )
    base.update(overrides)
    return base


LAYOUTS = {
    "hf_arrow_stream": (
        lambda root, texts, tokens: write_hf_arrow(root, tokens),
        {"file_type": "hf_arrow", "col_name": "input_ids"},
    ),
    "hf_arrow_file": (
        lambda root, texts, tokens: write_hf_arrow(root, tokens, file_format=True),
        {"file_type": "hf_arrow", "col_name": "input_ids"},
    ),
    "parquet_tokens": (
        lambda root, texts, tokens: write_parquet_tokens(root, tokens),
        {"file_type": "parquet"},
    ),
    "parquet_text": (
        lambda root, texts, tokens: write_parquet_text(root, texts),
        {"file_type": "parquet"},
    ),
    "megatron_core": (
        lambda root, texts, tokens: write_megatron_core(root, tokens),
        {"file_type": "megatron"},
    ),
    "megatron_fmsdata": (
        lambda root, texts, tokens: write_megatron_fmsdata(root, tokens),
        {"file_type": "megatron"},
    ),
    "pbin": (lambda root, texts, tokens: write_pbin(root, tokens, EOS), {"file_type": "pbin"}),
    "flat_npy": (lambda root, texts, tokens: write_flat(root, tokens, EOS), {"file_type": "npy"}),
    "flat_zero_tail": (
        lambda root, texts, tokens: write_flat(root, tokens, EOS, zero_tail=333, suffix=".bin"),
        {"file_type": "npy"},
    ),
    "jsonl": (lambda root, texts, tokens: write_jsonl(root, texts), {"file_type": "jsonl"}),
    "jsonl_gz_raw_content": (
        lambda root, texts, tokens: write_jsonl(root, texts, "raw_content", "gz"),
        {"file_type": "jsonl", "text_field": "raw_content"},
    ),
    "jsonl_zst": (
        lambda root, texts, tokens: write_jsonl(root, texts, compression="zst"),
        {"file_type": "jsonl"},
    ),
    "mds_bytes": (lambda root, texts, tokens: write_mds(root, tokens), {"file_type": "mds"}),
    "mds_ndarray_zstd": (
        lambda root, texts, tokens: write_mds(root, tokens, "ndarray:uint16", "zstd"),
        {"file_type": "mds"},
    ),
    "mds_ndarray_dynamic": (
        lambda root, texts, tokens: write_mds(root, tokens, "ndarray"),
        {"file_type": "mds"},
    ),
    "mds_writer_bytes": (
        lambda root, texts, tokens: write_mds_streaming(root, tokens),
        {"file_type": "mds"},
    ),
    "mds_writer_ndarray_zstd": (
        lambda root, texts, tokens: write_mds_streaming(root, tokens, "ndarray:uint16", "zstd"),
        {"file_type": "mds"},
    ),
    "mds_writer_ndarray_dynamic": (
        lambda root, texts, tokens: write_mds_streaming(root, tokens, "ndarray"),
        {"file_type": "mds"},
    ),
}


@pytest.fixture(scope="module")
def reference(documents, tmp_path_factory):
    _, tokens = documents
    root = tmp_path_factory.mktemp("arrow")
    write_arrow(root, tokens)
    return take(build_dataloader(config(root)), 25)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_layout_gives_the_arrow_batches(layout, documents, reference, tmp_path, monkeypatch):
    monkeypatch.setenv("FMSDATA_CACHE", str(tmp_path / "cache"))
    texts, tokens = documents
    write, options = LAYOUTS[layout]
    write(tmp_path / "data", texts, tokens)
    assert_same_batches(reference, take(build_dataloader(config(tmp_path / "data", **options)), 25))
    # file_type "auto" recognizes the layout by its files.
    auto = {k: v for k, v in options.items() if k != "file_type"}
    assert_same_batches(
        reference, take(build_dataloader(config(tmp_path / "data", file_type="auto", **auto)), 25)
    )


def test_megatron_builder_and_fmsdata_writer_agree_byte_for_byte(documents, tmp_path):
    _, tokens = documents
    write_megatron_core(tmp_path / "core", tokens)
    write_megatron_fmsdata(tmp_path / "ours", tokens)
    for name in sorted(os.listdir(tmp_path / "core" / "web")):
        a = (tmp_path / "core" / "web" / name).read_bytes()
        b = (tmp_path / "ours" / "web" / name).read_bytes()
        assert a == b, name


@pytest.mark.parametrize("encoding", ["bytes", "ndarray:uint16", "ndarray"])
def test_mds_writer_and_the_test_writer_agree_byte_for_byte(documents, tmp_path, encoding):
    _, tokens = documents
    write_mds_streaming(tmp_path / "writer", tokens, encoding)
    write_mds(tmp_path / "ours", tokens, encoding)
    for f in range(len(tokens["web"])):
        a = (tmp_path / "writer" / "web" / f"part_{f:03d}" / "shard.00000.mds").read_bytes()
        b = (tmp_path / "ours" / "web" / f"shard.{f:05d}.mds").read_bytes()
        assert a == b, f


def test_a_zero_filled_tail_is_not_served(documents, tmp_path, caplog):
    from fmsdata.handlers import FlatTokensHandler

    _, tokens = documents
    write_flat(tmp_path, {"web": tokens["web"][:1]}, EOS, zero_tail=500)
    handler = FlatTokensHandler("uint16", EOS, str(tmp_path / "cache"))
    reader = handler.open(str(tmp_path / "web" / "part_000.npy"))
    assert handler.num_docs(reader) == len(tokens["web"][0])
    assert "zero-filled tail of 500 tokens" in caplog.text
    assert all(
        np.array_equal(handler.get(reader, i)[:-1], d) for i, d in enumerate(tokens["web"][0])
    )
    # The document index is cached: a second open finds it.
    assert os.listdir(tmp_path / "cache" / "flat")


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_index_and_inspect_read_every_layout(layout, documents, tmp_path, monkeypatch, capsys):
    import csv
    import json

    from fmsdata.cli.main import main

    monkeypatch.setenv("FMSDATA_CACHE", str(tmp_path / "cache"))
    texts, tokens = documents
    write, options = LAYOUTS[layout]
    write(tmp_path / "data", texts, tokens)
    flags = ["--tokenizer", bundled_tokenizer_path(), "--token-dtype", "uint16"]
    flags += ["--separator", str(EOS)]
    for key, value in options.items():
        flags += ["--" + key.replace("_", "-"), value]
    # .pbin and flat documents keep their EOS; the others do not store one.
    per_doc = 1 if layout.startswith(("pbin", "flat")) else 0
    docs = {name: sum(len(f) for f in files) for name, files in tokens.items()}
    counted = {
        name: sum(len(d) + per_doc for f in files for d in f) for name, files in tokens.items()
    }

    assert main(["index", str(tmp_path / "data"), *flags]) == 0
    with open(tmp_path / "data" / "meta" / "counts.csv") as handle:
        rows = list(csv.DictReader(handle))
    for name in tokens:
        # Paths open with "/", as in the Bamba release's counts files.
        mine = [r for r in rows if r["dataset/filename"].startswith(f"/{name}/")]
        assert len(mine) == len(tokens[name])
        assert sum(int(r["documents"]) for r in mine) == docs[name]
        assert sum(int(r["tokens"]) for r in mine) == counted[name]

    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "data" / "web"), "--json", *flags]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["documents"] == docs["web"]
    assert figures["tokens"] == counted["web"]
    assert sum(figures["length_histogram"].values()) == docs["web"]

    assert main(["inspect", str(tmp_path / "data" / "code"), *flags]) == 0
    out = capsys.readouterr().out
    # The first document of the first file, decoded, opens the sample.
    assert texts["code"][0][0][:40] in out
