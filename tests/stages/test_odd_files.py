"""Odd files among a dataset's shards (issue 46): empty files, files whose documents are all
shorter than ``min_length``, one-document files, more logical shards than documents. None
of them may stop a run whose data holds documents; a dataset that truly has nothing says so.

Every token value is written once (``FIRST_TOKEN`` upwards), so a document is known by its
tokens: coverage is checked against the layout as written, never against the deal.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from chains import documents_by_epoch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oddfiles import MIN, Layout, info_of, loader_config, write_layout
from support import (
    FIRST_TOKEN,
    accesses,
    assert_same_batches,
    corpus,
    global_steps,
    rank_loaders,
    roundtrip,
    scratch_dir,
    take,
)

from fmsdata import build_dataloader
from fmsdata.errors import EmptyDatasetError
from fmsdata.stages.documents import Decoration, stream_class

_short = st.lists(st.integers(0, MIN - 1), min_size=1, max_size=5)
_long = st.lists(st.integers(MIN, MIN + 40), min_size=1, max_size=8)
_file = st.one_of(
    st.just([]),  # an empty file
    _short,  # every document under min_length
    _long,
    st.lists(st.one_of(st.integers(0, MIN - 1), st.integers(MIN, 300)), min_size=1, max_size=1),
)
layouts = st.lists(_file, min_size=1, max_size=6)


def check_passes(layout: Layout, order: str, n_shards: int, seed: int, line_tokens: int) -> None:
    """Each pass over the shards (epoch ``e`` of every shard) reads every kept document of
    the layout exactly once and nothing else, for two passes (a rotating dataset: a whole
    cycle and two more); or, when the layout holds no kept document, every shard says so."""
    access = accesses(info_of(layout), ["ds"])[0]
    cls = stream_class(order)
    kept = layout.kept
    if not kept:
        everything_empty = not any(layout.files)
        said = "are empty" if everything_empty else "has fewer than min_length=4"
        for shard in range(n_shards):
            with pytest.raises(EmptyDatasetError, match="holds no document to read") as caught:
                cls(
                    access, shard, n_shards, seed, Decoration(min_length=MIN), line_tokens
                ).read_ahead()
            assert said in str(caught.value)
        return
    streams = [
        cls(access, shard, n_shards, seed, Decoration(min_length=MIN), line_tokens)
        for shard in range(n_shards)
    ]
    rotating = {s.size > 0 and s.rotating for s in streams}
    assert len(rotating) == 1, "shards disagree on whether the dataset rotates"
    stop = n_shards + 2 if rotating.pop() else 2
    passes: dict[int, list[tuple[str, int]]] = {}
    for stream in streams:
        for epoch, docs in documents_by_epoch(stream, stop).items():
            passes.setdefault(epoch, []).extend(docs)
    assert sorted(passes) == list(range(stop))
    for epoch, docs in passes.items():
        assert sorted(docs) == sorted(kept), f"pass {epoch} is not every kept document once"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    files=layouts,
    n_shards=st.integers(1, 8),
    order=st.sampled_from(["random", "sequential"]),
    seed=st.integers(0, 99),
    line_tokens=st.sampled_from([0, 17, 10**6]),
)
def test_every_layout_covers_its_kept_documents_once_per_pass(
    files, n_shards, order, seed, line_tokens
):
    layout = write_layout(scratch_dir(), files, other=False)
    check_passes(layout, order, n_shards, seed, line_tokens)


def ds_tokens(batches, layout: Layout) -> np.ndarray:
    """The token values of dataset ``ds`` in ``batches`` (``other``'s come after them)."""
    end = FIRST_TOKEN + sum(sum(lengths) for lengths in layout.files)
    values = np.concatenate([b["input_ids"].numpy().ravel() for b in batches])
    return values[(values >= FIRST_TOKEN) & (values < end)]


def check_loader(layout: Layout, n_shards: int) -> None:
    """A run loads, carries only kept documents of ``ds``, resumes exactly at several
    points and continues exactly on another world size; or, when ``ds`` has nothing, fails
    saying so."""
    config = loader_config(layout, n_shards)
    if not layout.kept:
        with pytest.raises(EmptyDatasetError, match="dataset 'ds' holds no document to read"):
            take(build_dataloader(config, rank=0, world_size=1), 1)
        return
    total = 14
    reference = take(build_dataloader(config, rank=0, world_size=1), total)
    shorts = {
        v
        for lengths, firsts in _firsts(layout)
        for n, first in zip(lengths, firsts)
        if n < MIN
        for v in range(first, first + n)
    }
    assert not shorts & set(ds_tokens(reference, layout).tolist()), "a short document came"
    for k in (0, 5, 13):
        head = build_dataloader(config, rank=0, world_size=1)
        assert_same_batches(reference[:k], take(head, k))
        state = roundtrip(head.snapshot())
        resumed = build_dataloader(config, rank=0, world_size=1)
        resumed.load_state_dict(state)
        assert_same_batches(reference[k:], take(resumed, total - k))
    if n_shards % 2 == 0:  # rescale 1 -> 2 ranks after 6 global steps
        steps = global_steps(rank_loaders(config, 1), total)
        before = rank_loaders(config, 1)
        assert global_steps(before, 6) == steps[:6]
        states = [roundtrip(loader.snapshot()) for loader in before]
        after = rank_loaders(config, 2, batch_size=n_shards // 2)
        for loader in after:
            loader.load_state_dict(states)
        assert global_steps(after, total - 6) == steps[6:]


def _firsts(layout: Layout):
    token = FIRST_TOKEN
    for lengths in layout.files:
        firsts = []
        for n in lengths:
            firsts.append(token)
            token += n
        yield lengths, firsts


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=layouts, n_shards=st.sampled_from([2, 4]))
def test_every_layout_loads_resumes_and_rescales_or_says_it_has_nothing(files, n_shards):
    check_loader(write_layout(scratch_dir(), files), n_shards)


GOOD = [20] * 50


@pytest.mark.parametrize(
    "files",
    [
        [GOOD],
        [GOOD, []],  # an empty shard file after
        [[], GOOD],  # ... first
        [[], GOOD, []],  # two of them
        [[2] * 30, [20] * 40],  # every document of a file under min_length
        [[20] * 3],  # fewer documents than shards (rotates)
        [[500], [], [600], [700]],  # ... long ones, with an empty file
    ],
    ids=["plain", "empty-after", "empty-first", "two-empty", "short-file", "three", "few-long"],
)
def test_the_issue_layouts_load_and_resume(tmp_path, files):
    layout = write_layout(str(tmp_path), files)
    check_loader(layout, 4)
    check_passes(layout, "random", 4, 3, 17)


@pytest.mark.parametrize(
    ("files", "said"),
    [
        ([[], []], "all its 2 file(s) are empty (no document)"),
        ([[1, 2], [3, 0, 2]], "every one of the 5 document(s) in its 2 file(s) has fewer than"),
        ([[1, 2], []], "fewer than min_length=4 tokens (1 of the files are empty)"),
    ],
)
def test_a_dataset_that_has_nothing_says_what_it_holds(tmp_path, files, said):
    layout = write_layout(str(tmp_path), files)
    with pytest.raises(EmptyDatasetError) as caught:
        take(build_dataloader(loader_config(layout, 4), rank=0, world_size=1), 1)
    assert str(caught.value).startswith("dataset 'ds' holds no document to read: ")
    assert said in str(caught.value)


def test_files_are_searched_only_where_their_counts_leave_it_open(tmp_path, monkeypatch):
    """A file whose counts show it holds more tokens than skipped documents could is not
    opened to be searched; one whose counts cannot tell is, up to its first kept document."""
    from fmsdata.data import filecounts
    from fmsdata.data.access import DatasetAccess

    info = corpus(tmp_path, {"a": 3}, docs_per_file=30, mean_length=40)
    searched = []
    search = DatasetAccess._holds_kept

    def counted(self, file, n, decoration):
        searched.append(file)
        return search(self, file, n, decoration)

    monkeypatch.setattr(DatasetAccess, "_holds_kept", counted)
    filecounts.forget_all()
    access = accesses(info, ["a"])[0]
    assert access.live_files(Decoration(min_length=MIN)).all()
    assert searched == [0, 1, 2]  # no token counts: each is searched
    for path, (_, lengths) in info.files.items():
        filecounts.remember(
            info.root, path, os.path.getsize(f"{info.root}/{path}"), 30, int(lengths.sum())
        )
    searched.clear()
    access = accesses(info, ["a"])[0]
    assert access.live_files(Decoration(min_length=MIN + 1)).all()
    assert searched == []
    filecounts.forget_all()


def test_a_share_of_only_short_documents_inside_a_file_is_named(tmp_path):
    """The one layout the deal does not mend (it counts documents per file, never reads
    their lengths): a run of short documents inside a file that also holds long ones, as
    long as a whole share. The shard's error names it and what to do."""
    layout = write_layout(str(tmp_path), [[2] * 10 + [20] * 30])
    with pytest.raises(EmptyDatasetError) as caught:
        take(build_dataloader(loader_config(layout, 4), rank=0, world_size=1), 4)
    assert str(caught.value) == (
        "dataset 'ds': none of the 10 document(s) that logical shard 0 of 4 is dealt "
        "(ds/f00.arrow) has at least min_length=4 tokens, though the dataset holds such "
        "documents elsewhere (a run of short documents inside a file as long as a shard's "
        "share); use fewer logical_shards, or move the short documents out"
    )
