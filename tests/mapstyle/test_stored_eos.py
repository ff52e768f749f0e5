"""get_dataset never doubles a stored EOS silently: a root without metadata.json whose
Arrow or Megatron documents already end with the EOS (Megatron ``--append-eod``, Arrow
another tool wrote) is refused, naming the file, the token, how many sampled documents
end with it and the fix, before any window is read (at build, or in the process that
reads, DataLoader workers included); ``documents_end_with_eos=True`` reads it as the
writer's documents with one EOS each; documents without a stored EOS read as before."""

from __future__ import annotations

import importlib.util
import json
import re

import numpy as np
import pytest
import torch
from formats import write_arrow, write_megatron_core, write_megatron_fmsdata
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import fmsdata
from fmsdata.cli.main import main
from fmsdata.errors import ConfigError

EOS = 2
DOCS_PER_FILE = 20  # more than the 16 documents sampled per file


def documents(seed=0, n_files=(2, 1), mean=9):
    """``{dataset: [file: [document]]}``; token values encode (dataset, file, document,
    position) and are never EOS."""
    rng = np.random.default_rng(seed)
    return {
        f"ds{d}": [
            [
                3 + 10_000 * d + 1_000 * f + 40 * k + np.arange(int(rng.integers(1, 2 * mean)))
                for k in range(DOCS_PER_FILE)
            ]
            for f in range(count)
        ]
        for d, count in enumerate(n_files)
    }


def with_eos(files):
    """The same documents as a writer that appends the EOS stores them."""
    return {name: [[np.append(d, EOS) for d in f] for f in per] for name, per in files.items()}


def reference(files):
    """The stream: every document of every file, in folder and file order, then one EOS."""
    return np.concatenate(
        [np.append(d, EOS) for name in sorted(files) for per in files[name] for d in per]
    ).astype(np.int64)


def _megatron_core(root, files):
    if importlib.util.find_spec("megatron") is None:
        pytest.skip("megatron-core is not installed")
    write_megatron_core(root, files)


WRITERS = {
    "arrow": write_arrow,
    "megatron": write_megatron_fmsdata,  # fmsdata's own writer of FORMATS.md's layout
    "megatron_core": _megatron_core,  # megatron-core's IndexedDatasetBuilder
}
SUFFIX = {"arrow": ".arrow", "megatron": ".idx", "megatron_core": ".idx"}  # catalog names


def build(root, length, cache_dir, **kw):
    return fmsdata.get_dataset(str(root), length, eos_token=EOS, cache_dir=str(cache_dir), **kw)


def windows(ds):
    return [ds[i]["token_ids"].numpy() for i in range(len(ds))]


def check_windows(ds, stream, length, overlap):
    stride = length - overlap
    assert len(ds) == (len(stream) - length) // stride + 1
    for i, window in enumerate(windows(ds)):
        assert np.array_equal(window, stream[i * stride : i * stride + length])


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_stored_eos_is_refused_naming_file_token_count_and_fix(tmp_path, fmt):
    WRITERS[fmt](tmp_path / "root", with_eos(documents()))
    first = tmp_path / "root" / "ds0" / f"part_000{SUFFIX[fmt]}"
    message = (
        rf"{re.escape(str(first))}: 16 of 16 sampled documents already end with eos_token=2, "
        r"and get_dataset adds eos_token after every document .* each would end with it "
        r"twice\. Pass documents_end_with_eos=True to keep the stored ones and add none"
    )
    with pytest.raises(ConfigError, match=message):
        build(tmp_path / "root", 16, tmp_path / "cache")
    # A count cached by a build told to add one anyway (explicit False: unchecked) does
    # not spare a later build its check.
    build(tmp_path / "root", 16, tmp_path / "cache", documents_end_with_eos=False)
    with pytest.raises(ConfigError, match=message):
        build(tmp_path / "root", 16, tmp_path / "cache")


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_refused_before_any_window_when_counts_open_nothing(tmp_path, fmt):
    """With meta/counts.csv (``fmsdata index``) the build opens no file: the process that
    reads a window, a DataLoader worker too, checks the file first."""
    WRITERS[fmt](tmp_path / "root", with_eos(documents()))
    assert main(["index", str(tmp_path / "root"), "--file-type", fmt.split("_")[0]]) == 0
    ds = build(tmp_path / "root", 16, tmp_path / "cache", datasets=["ds0", "ds1"])
    message = r"part_000\.\w+: 16 of 16 sampled documents already end with eos_token=2"
    with pytest.raises(ConfigError, match=message):
        ds[0]
    with pytest.raises(ConfigError, match=message):
        ds[len(ds) - 1]  # every file is checked, not only the first one read
    loader = DataLoader(ds, batch_size=2, num_workers=1)
    with pytest.raises(ConfigError, match=message):
        next(iter(loader))
    kept = build(
        tmp_path / "root",
        16,
        tmp_path / "cache",
        datasets=["ds0", "ds1"],
        documents_end_with_eos=True,
    )
    check_windows(kept, reference(documents()), 16, 0)


@settings(max_examples=25, deadline=None)
@given(
    fmt=st.sampled_from(["arrow", "megatron"]),
    length=st.integers(1, 48),
    overlap=st.integers(0, 47),
    seed=st.integers(0, 3),
)
def test_kept_stored_eos_reads_as_the_writers_documents(
    tmp_path_factory, fmt, length, overlap, seed
):
    """Documents stored with their EOS, read with documents_end_with_eos=True, and the same
    documents stored without it, read as default, are both the reference stream."""
    overlap = min(overlap, length - 1)
    tmp = tmp_path_factory.mktemp("r")
    files = documents(seed)
    stream = reference(files)
    WRITERS[fmt](tmp / "ended", with_eos(files))
    WRITERS[fmt](tmp / "plain", files)
    kw = {"overlap": overlap}
    kept = build(tmp / "ended", length, tmp / "c", documents_end_with_eos=True, **kw)
    plain = build(tmp / "plain", length, tmp / "c", **kw)
    told = build(tmp / "plain", length, tmp / "c", documents_end_with_eos=False, **kw)
    for ds in (kept, plain, told):
        assert ds.num_tokens() == len(stream)
        check_windows(ds, stream, length, overlap)


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_workers_read_kept_and_plain_roots(tmp_path, fmt):
    files = documents(1)
    stream = reference(files)
    WRITERS[fmt](tmp_path / "ended", with_eos(files))
    WRITERS[fmt](tmp_path / "plain", files)
    for root, kw in (("ended", {"documents_end_with_eos": True}), ("plain", {})):
        ds = build(tmp_path / root, 12, tmp_path / "cache", overlap=1, **kw)
        got = torch.cat([b["token_ids"] for b in DataLoader(ds, batch_size=3, num_workers=1)])
        stride = 11
        assert len(got) == len(ds) == (len(stream) - 12) // stride + 1
        for i, window in enumerate(got.numpy()):
            assert np.array_equal(window, stream[i * stride : i * stride + 12])


def test_a_few_documents_ending_with_eos_are_not_refused(tmp_path):
    """Most sampled documents must end with the EOS: a token that happens to end a few is
    content, read as stored with one EOS added."""
    files = documents(2)
    files["ds0"][0] = [np.append(d, EOS) if k < 5 else d for k, d in enumerate(files["ds0"][0])]
    write_arrow(tmp_path / "root", files)
    check_windows(build(tmp_path / "root", 10, tmp_path / "cache"), reference(files), 10, 0)


def test_explicit_false_adds_one_anyway_and_bad_values(tmp_path):
    files = documents(3)
    write_arrow(tmp_path / "root", with_eos(files))
    ds = build(tmp_path / "root", 10, tmp_path / "cache", documents_end_with_eos=False)
    check_windows(ds, reference(with_eos(files)), 10, 0)  # what the caller asked for
    with pytest.raises(ConfigError, match=r"documents_end_with_eos must be .* got 'yes'"):
        build(tmp_path / "root", 10, tmp_path / "cache", documents_end_with_eos="yes")


def test_metadata_records_it_and_a_contradiction_is_refused(tmp_path):
    files = documents(4)
    write_arrow(tmp_path / "root", with_eos(files))
    entry = {"format": "arrow", "eos_token": EOS, "documents_end_with_eos": True}
    meta = {"datasets": {"ds0": entry, "ds1": entry}}
    (tmp_path / "root" / "metadata.json").write_text(json.dumps(meta))
    check_windows(build(tmp_path / "root", 10, tmp_path / "cache"), reference(files), 10, 0)
    with pytest.raises(ConfigError, match=r"documents_end_with_eos=False contradicts .*"):
        build(tmp_path / "root", 10, tmp_path / "cache", documents_end_with_eos=False)
