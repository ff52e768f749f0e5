"""get_dataset: windows over every format, checked against the writer's documents."""

from __future__ import annotations

import importlib
import json
import pickle

import numpy as np
import pytest
import torch
from formats import write_arrow, write_flat, write_mds, write_megatron_fmsdata, write_pbin
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler

import fmsdata
from fmsdata.errors import ConfigError, ShardFormatError
from fmsdata.mapstyle import document_mask

EOS = 2


def make_files(seed=0, n_files=(3, 2), docs=(1, 9), mean=20):
    """``{dataset: [docs per file]}``; token values encode (dataset, file, doc)."""
    rng = np.random.default_rng(seed)
    files = {}
    for d, count in enumerate(n_files):
        per_file = []
        for f in range(count):
            n = int(rng.integers(*docs))
            per_file.append(
                [
                    (100 + 1000 * d + 97 * f + 7 * k + np.arange(int(rng.integers(1, 2 * mean))))
                    % 60000
                    + 3
                    for k in range(n)
                ]
            )
        files[f"ds{d}"] = per_file
    return files


def reference(files):
    """The stream and its document number per token, from the writer's documents."""
    tokens, docs, k = [], [], 0
    for name in sorted(files):
        for per_file in files[name]:
            for doc in per_file:
                tokens.append(np.append(doc, EOS))
                docs.append(np.full(len(doc) + 1, k))
                k += 1
    return np.concatenate(tokens).astype(np.int64), np.concatenate(docs)


WRITERS = {
    "arrow": lambda root, files: write_arrow(root, files),
    "megatron": lambda root, files: write_megatron_fmsdata(root, files),
    "flat": lambda root, files: write_flat(root, files, EOS),
    "pbin": lambda root, files: write_pbin(root, files, EOS),
    "mds": lambda root, files: write_mds(root, files, encoding="ndarray:uint16"),
}
OPTIONS = {"flat": {"token_dtype": "uint16"}}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FMSDATA_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def build(root, fmt, length, **kw):
    kw.setdefault("eos_token", EOS)
    return fmsdata.get_dataset(str(root), length, **OPTIONS.get(fmt, {}), **kw)


def renumber(ids):
    out = np.zeros(len(ids), np.int64)
    out[1:] = np.cumsum(ids[1:] != ids[:-1])
    return out


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_windows_are_the_stream(tmp_path, cache, fmt):
    files = make_files(seed=len(fmt))
    WRITERS[fmt](tmp_path / "root", files)
    stream, docs = reference(files)
    ds = build(tmp_path / "root", fmt, 16, create_doc_mask=True)
    assert ds.num_tokens() == len(stream) and ds.num_files() == 5
    assert len(ds) == len(stream) // 16
    got = np.concatenate([ds[i]["token_ids"].numpy() for i in range(len(ds))])
    assert np.array_equal(got, stream[: len(ds) * 16])
    for i in range(len(ds)):
        item = ds[i]
        truth = docs[i * 16 : (i + 1) * 16]
        assert np.array_equal(item["document_ids"].numpy(), renumber(truth))
        dense = (truth[:, None] == truth[None, :]) & np.tri(16, dtype=bool)
        compact = item["document_mask"].numpy()
        q, k = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
        assert np.array_equal((compact[:, None] <= k) & (k <= q), dense)
    dense_ds = build(tmp_path / "root", fmt, 16, create_doc_mask=True, dense_mask=True)
    truth = docs[16:32]
    assert np.array_equal(
        dense_ds[1]["document_mask"].numpy(),
        (truth[:, None] == truth[None, :]) & np.tri(16, dtype=bool),
    )


@settings(max_examples=30)
@given(
    length=st.integers(1, 40),
    overlap=st.integers(0, 39),
    drop_last=st.booleans(),
    fmt=st.sampled_from(["arrow", "flat", "megatron"]),
    seed=st.integers(0, 3),
)
def test_windows_tile_with_overlap(tmp_path_factory, length, overlap, drop_last, fmt, seed):
    overlap = min(overlap, length - 1)
    root = tmp_path_factory.mktemp("r")
    files = make_files(seed=seed, n_files=(2, 1), docs=(1, 4), mean=8)
    WRITERS[fmt](root / "root", files)
    stream, _ = reference(files)
    ds = build(
        root / "root", fmt, length, overlap=overlap, drop_last=drop_last, cache_dir=str(root / "c")
    )
    stride = length - overlap
    for i in range(len(ds)):
        window = ds[i]["token_ids"].numpy()
        part = stream[i * stride : i * stride + length]
        assert np.array_equal(window[: len(part)], part)
        assert np.all(window[len(part) :] == 0)
    # Every token is in some window; the windows after the last start no earlier token.
    covered = (len(ds) - 1) * stride + length if len(ds) else 0
    if drop_last:
        assert covered <= len(stream) < covered + stride or len(stream) < length
    else:
        assert covered >= len(stream)


def test_sampler_covers_every_window_once_and_olmo_contract(tmp_path, cache):
    write_arrow(tmp_path / "root", make_files())
    # OLMo's custom_dataset: importlib by dotted name, called with the config's args.
    config = {
        "name": "fmsdata.get_dataset",
        "args": {"metadata": str(tmp_path / "root"), "context_length": 8, "eos_token": EOS},
    }
    module, name = config["name"].rsplit(".", 1)
    ds = getattr(importlib.import_module(module), name)(**config["args"])
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=3)
        order = list(sampler)
        loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=0)
        # collate_config.input_id_field: token_ids -> the model's input_ids
        input_ids = torch.cat([batch["token_ids"] for batch in loader])
        assert input_ids.dtype == torch.long and input_ids.shape == (len(order), 8)
        assert torch.equal(input_ids, torch.stack([ds[i]["token_ids"] for i in order]))
        seen.extend(order)
    padded = (-len(ds)) % 2  # DistributedSampler repeats windows to even out the ranks
    assert sorted(set(seen)) == list(range(len(ds))) and len(seen) == len(ds) + padded


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_fork_and_spawn(tmp_path, cache, context):
    write_flat(tmp_path / "root", make_files(), EOS)
    ds = build(tmp_path / "root", "flat", 8)
    ds[0]  # opened in the parent: workers must not reuse its readers
    assert len(pickle.dumps(ds)) < 4096
    loader = DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context=context)
    got = torch.cat([b["token_ids"] for b in loader])
    assert torch.equal(got, torch.stack([ds[i]["token_ids"] for i in range(len(ds))]))


def test_splits(tmp_path, cache):
    write_arrow(tmp_path / "root", make_files())
    ds = build(tmp_path / "root", "arrow", 4)
    n = len(ds)
    full = [ds[i]["token_ids"] for i in range(n)]
    ds.create_split(0.25)
    assert len(ds) == n  # creating a split keeps serving every window
    ds.set_split("train")
    k = n - len(ds)
    assert k == round(n * 0.25)
    val = build(tmp_path / "root", "arrow", 4, val_split_size=0.25, split="val")
    assert len(val) == k and torch.equal(val[0]["token_ids"], full[n - k])  # tatm: the tail
    seeded = [
        build(tmp_path / "root", "arrow", 4, val_split_size=k, split=s, split_seed=5)
        for s in ("train", "val")
    ]
    windows = [seeded[s].window_index(i) for s in (0, 1) for i in range(len(seeded[s]))]
    assert sorted(windows) == list(range(n)) and len(seeded[1]) == k
    assert windows[-k:] != list(range(n - k, n))  # the seed picks other windows
    again = build(tmp_path / "root", "arrow", 4, val_split_size=k, split="val", split_seed=5)
    assert [again.window_index(i) for i in range(k)] == windows[-k:]
    with pytest.raises(ConfigError, match="create_split"):
        build(tmp_path / "root", "arrow", 4).set_split("val")
    with pytest.raises(IndexError):
        seeded[1][k]


def test_names_metadata_files_and_tatm_roots(tmp_path, cache, monkeypatch):
    files = make_files()
    write_flat(tmp_path / "data" / "corpus", files, EOS)
    root = tmp_path / "data" / "corpus"
    meta = {
        "datasets": {
            "ds0": {"format": "flat", "eos_token": EOS, "documents_end_with_eos": True},
            "ds1": {"format": "flat", "eos_token": EOS, "documents_end_with_eos": True},
        },
        "tokenizer": {"vocab_size": 65000, "dtype": "uint16"},
    }
    (root / "metadata.json").write_text(json.dumps(meta))
    monkeypatch.setenv("FMSDATA_DATA_DIR", str(tmp_path / "data"))
    stream, _ = reference(files)
    for target in ("corpus", str(root), str(root / "metadata.json")):
        ds = fmsdata.get_dataset(target, 10, token_dtype="uint16")
        assert ds.vocab_size == 65000 and ds.eos_token == EOS
        assert np.array_equal(ds[3]["token_ids"].numpy(), stream[30:40])
    with pytest.raises(ConfigError, match=r"no dataset named 'nope'.*\['corpus'\]"):
        fmsdata.get_dataset("nope", 10)
    # tatm's layout: {prefix}_{i}.bin beside metadata.yaml naming prefix, dtype, vocab.
    tatm = tmp_path / "tatm"
    tatm.mkdir()
    docs = files["ds0"][0] + files["ds0"][1]
    for i, chunk in enumerate((docs[:3], docs[3:])):
        np.concatenate([np.append(d, 1) for d in chunk]).astype("uint32").tofile(
            tatm / f"out_{i}.bin"
        )
    (tatm / "metadata.yaml").write_text(
        "name: out\ntokenized_info:\n  tokenizer: t5-base\n"
        "  file_prefix: /elsewhere/out\n  dtype: uint32\n  file_extension: bin\n"
        "  vocab_size: 32100\n"
    )
    ds = fmsdata.get_dataset(str(tatm), 5, eos_token=1, token_output_format="numpy")
    flat = np.concatenate([np.append(d, 1) for d in docs])
    assert ds.vocab_size == 32100 and ds.num_files() == 2
    assert np.array_equal(
        np.concatenate([ds[i]["token_ids"] for i in range(len(ds))]), flat[: len(ds) * 5]
    )


def test_counts_are_cached_once(tmp_path, cache, monkeypatch):
    write_megatron_fmsdata(tmp_path / "root", make_files())
    first = build(tmp_path / "root", "megatron", 8)
    assert list((cache / "mapstyle").iterdir())

    def refuse(self, path):
        raise AssertionError(f"opened {path} to count it again")

    from fmsdata.handlers.megatron import MegatronHandler

    monkeypatch.setattr(MegatronHandler, "count", refuse)
    again = build(tmp_path / "root", "megatron", 8)
    assert len(again) == len(first)


def test_changed_file_and_bad_arguments(tmp_path, cache):
    files = make_files()
    write_flat(tmp_path / "root", files, EOS)
    ds = build(tmp_path / "root", "flat", 8)
    path = tmp_path / "root" / "ds0" / "part_000.npy"
    data = np.fromfile(path, np.uint16)
    np.append(data, [7, 7, EOS]).astype(np.uint16).tofile(path)
    with pytest.raises(ShardFormatError, match="part_000.npy: .* the file changed"):
        ds[0]
    # Same size, other documents: the handler path (Arrow) checks the file's token count.
    write_arrow(tmp_path / "arrow", files)
    ds = build(tmp_path / "arrow", "arrow", 8)
    shorter = {
        k: [[d[:-1] for d in docs] + [np.arange(3, 3 + len(docs))] for docs in v]
        for k, v in files.items()
    }
    write_arrow(tmp_path / "arrow", shorter)
    with pytest.raises(ShardFormatError, match="part_000.arrow"):
        ds[0]
    for bad in ({"overlap": 8}, {"token_output_format": "jax"}):
        with pytest.raises(ConfigError):
            build(tmp_path / "root", "flat", 8, **bad)
    with pytest.raises(ConfigError, match="context_length"):
        build(tmp_path / "root", "flat", 0)


def test_document_mask_forms():
    ids = np.array([0, 0, 1, 1, 1, 2])
    compact = document_mask(ids)
    assert compact.tolist() == [0, 0, 2, 2, 2, 5]
    dense = document_mask(ids, dense=True)
    assert dense.dtype == bool and dense[3].tolist() == [False, False, True, True, False, False]
