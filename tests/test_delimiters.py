"""Stored delimiters are never doubled silently: documents that already end with the
configured ``eos_token`` (or start with ``bos_token``) in a root without ``metadata.json``,
in every format the loader reads, are refused with a ConfigError naming the file, the
field, its value and the fix, unless the config says what to do with them; documents
that do not carry them load as before."""

import re

import numpy as np
import pytest
from formats import (
    write_arrow,
    write_flat,
    write_hf_arrow,
    write_jsonl,
    write_mds,
    write_megatron_fmsdata,
    write_parquet_text,
    write_parquet_tokens,
    write_pbin,
)
from support import take

from fmsdata import build_dataloader
from fmsdata.errors import ConfigError
from fmsdata.util.textcorpus import bundled_tokenizer_path

BOS, EOS = 0, 1  # the bundled tokenizer's <|bos|> and <|eos|>
# Token values that say where they came from (file, document, position), never 0 or 1.
DOCS = [
    [np.arange(7, 7 + 5 + (d % 7), dtype=np.uint16) + 100 * d + 5000 * f for d in range(20)]
    for f in range(2)
]
TEXTS = [[f"file {f} document {d} has words like {d * 13}" for d in range(20)] for f in range(2)]


def _cepe(root, docs):
    import os

    os.makedirs(os.path.join(root, "ds"), exist_ok=True)
    for f, chunk in enumerate(docs):
        lengths = [len(d) for d in chunk]
        np.save(
            os.path.join(root, "ds", f"part_{f:03d}.npy"),
            np.array([len(chunk), *lengths, *np.concatenate(chunk)], dtype=np.int64),
        )


def _framed(docs, bos, eos):
    """The documents, each preceded by BOS when ``bos`` and followed by EOS when ``eos``."""
    return [
        [
            np.concatenate([[BOS] if bos else [], d, [EOS] if eos else []]).astype(np.uint16)
            for d in chunk
        ]
        for chunk in docs
    ]


def _texts(bos, eos):
    return [[("<|bos|>" if bos else "") + t + ("<|eos|>" if eos else "") for t in c] for c in TEXTS]


# name: (write(root, bos, eos) storing documents framed so, file_type, options). pbin and
# flat streams always store their end token (the writers add it): they take no eos flag.
FORMATS = {
    "arrow": (lambda r, b, e: write_arrow(r, {"ds": _framed(DOCS, b, e)}), "arrow", {}),
    "hf_arrow": (
        lambda r, b, e: write_hf_arrow(r, {"ds": _framed(DOCS, b, e)}),
        "hf_arrow",
        {"col_name": "input_ids"},
    ),
    "parquet_tokens": (
        lambda r, b, e: write_parquet_tokens(r, {"ds": _framed(DOCS, b, e)}),
        "parquet",
        {},
    ),
    "parquet_text": (lambda r, b, e: write_parquet_text(r, {"ds": _texts(b, e)}), "parquet", {}),
    "megatron": (
        lambda r, b, e: write_megatron_fmsdata(r, {"ds": _framed(DOCS, b, e)}),
        "megatron",
        {},
    ),
    "mds": (lambda r, b, e: write_mds(r, {"ds": _framed(DOCS, b, e)}), "mds", {}),
    "jsonl": (lambda r, b, e: write_jsonl(r, {"ds": _texts(b, e)}), "jsonl", {}),
    "jsonl_gz": (
        lambda r, b, e: write_jsonl(r, {"ds": _texts(b, e)}, compression="gz"),
        "jsonl",
        {},
    ),
    "jsonl_zst": (
        lambda r, b, e: write_jsonl(r, {"ds": _texts(b, e)}, compression="zst"),
        "jsonl",
        {},
    ),
    "cepe": (lambda r, b, e: _cepe(r, _framed(DOCS, b, e)), "cepe", {}),
    "pbin": (lambda r, b, e: write_pbin(r, {"ds": _framed(DOCS, b, False)}, EOS), "pbin", {}),
    "flat": (lambda r, b, e: write_flat(r, {"ds": _framed(DOCS, b, False)}, EOS), "npy", {}),
}
STRUCTURAL = ("pbin", "flat")  # the format itself ends each document with its EOS
AUTO = [name for name in FORMATS if name != "cepe"]  # auto never picks cepe


def config(root, **overrides):
    return {
        "data_path": str(root),
        "datasets": ["ds"],
        "seq_length": 32,
        "batch_size": 2,
        "logical_shards": 2,
        "tokenizer": bundled_tokenizer_path(),
        "token_dtype": "uint16",
        "num_workers": 0,
        **overrides,
    }


def lines(loader, n=12):
    return [
        np.concatenate([b["input_ids"].numpy(), b["labels"].numpy()[:, -1:]], axis=1)
        for b in take(loader, n)
    ]


def refused(root, field, value, **overrides):
    with pytest.raises(ConfigError) as err:
        take(build_dataloader(config(root, **overrides)), 1)
    message = str(err.value)
    assert re.search(rf"{re.escape(str(root))}/ds/\S+: ", message), message  # names the file
    assert f"{field}={value}" in message, message
    assert f"strip_tokens: [{value}]" in message and f"{field}: null" in message, message
    return message


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_documents_ending_with_the_eos_token_are_refused(name, tmp_path):
    write, file_type, options = FORMATS[name]
    write(tmp_path, False, True)
    types = [file_type] + (["auto"] if name in AUTO else [])
    for chosen in types:
        if chosen in ("npy", "pbin"):
            continue  # the format says so: the added EOS replaces the stored one (rootconfig)
        message = refused(tmp_path, "eos_token", EOS, file_type=chosen, eos_token=EOS, **options)
        assert "end with" in message, message


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_documents_starting_with_the_bos_token_are_refused(name, tmp_path):
    write, file_type, options = FORMATS[name]
    write(tmp_path, True, False)
    strip = [EOS] if name in STRUCTURAL else []
    for chosen in [file_type] + (["auto"] if name in AUTO else []):
        message = refused(
            tmp_path,
            "bos_token",
            BOS,
            file_type=chosen,
            bos_token=BOS,
            eos_token=EOS,
            strip_tokens=strip,
            **options,
        )
        assert "start with" in message, message


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_the_fix_the_error_names_loads_one_eos_per_document(name, tmp_path):
    write, file_type, options = FORMATS[name]
    write(tmp_path, False, True)
    for chosen in [file_type] + (["auto"] if name in AUTO else []):
        replaced = lines(
            build_dataloader(
                config(tmp_path, file_type=chosen, eos_token=EOS, strip_tokens=[EOS], **options)
            )
        )
        assert not any(np.any((x[:, 1:] == EOS) & (x[:, :-1] == EOS)) for x in replaced), chosen
        assert sum(int((x == EOS).sum()) for x in replaced) > 0
        if name not in STRUCTURAL:  # a flat stream is split on its separator: it needs one
            kept = lines(build_dataloader(config(tmp_path, file_type=chosen, **options)))
            assert all(np.array_equal(a, b) for a, b in zip(kept, replaced)), chosen


@pytest.mark.parametrize("name", sorted(set(FORMATS) - set(STRUCTURAL)))
def test_documents_without_stored_delimiters_load_as_before(name, tmp_path):
    write, file_type, options = FORMATS[name]
    write(tmp_path, False, False)
    got = lines(
        build_dataloader(
            config(tmp_path, file_type=file_type, bos_token=BOS, eos_token=EOS, **options)
        )
    )
    assert not any(np.any((x[:, 1:] == EOS) & (x[:, :-1] == EOS)) for x in got)
    assert sum(int((x == BOS).sum()) for x in got) > 0


def test_a_few_documents_ending_with_eos_are_content_not_a_format(tmp_path):
    """Only most of the sampled documents ending with it says the writer stored it."""
    docs = [[d.copy() for d in chunk] for chunk in DOCS]
    docs[0][3] = np.append(docs[0][3], EOS).astype(np.uint16)
    write_arrow(tmp_path, {"ds": docs})
    assert lines(build_dataloader(config(tmp_path, file_type="arrow", eos_token=EOS)))


def test_a_worker_raises_the_same_error(tmp_path):
    write_megatron_fmsdata(tmp_path, {"ds": _framed(DOCS, False, True)})
    refused(tmp_path, "eos_token", EOS, file_type="megatron", eos_token=EOS, num_workers=1)
