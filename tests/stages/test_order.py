"""``document_order: sequential``: files in order, documents in stored order, no shuffle."""

import pytest
from chains import chain, document_starts, recipe, writer_order
from hypothesis import given, settings
from hypothesis import strategies as st
from stagecheck import check_stage_rescale, check_stage_resume
from support import base_config, check_resume, corpus, scratch_dir

from fmsdata import build_dataloader
from fmsdata.errors import ConfigError, StateMismatchError


def starts_per_dataset(info, rec, stage, n_lines):
    """Each dataset's document starts in the first ``n_lines`` lines of a chain."""
    out = {name: [] for name in rec.names}
    for _ in range(n_lines):
        for start in document_starts(info, rec, next(stage)):
            out[start[0]].append(start)
    return out


@settings(max_examples=12, deadline=None)
@given(
    n_shards=st.sampled_from([1, 2, 3, 4]),
    files=st.tuples(st.integers(1, 4), st.integers(1, 3)),
    docs=st.integers(4, 20),
    seed=st.integers(0, 99),
)
def test_sequential_order_is_the_writers_order(n_shards, files, docs, seed):
    """One shard: every dataset's documents come in the writer's order, epoch after epoch;
    several: the shards' first epochs, concatenated in shard order, give that order."""
    info = corpus(scratch_dir(), {"a": files[0], "b": files[1]}, docs_per_file=docs)
    rec = recipe(
        info,
        datasets=["a", "b"],
        weights=[2, 1],
        seq_length=24,
        logical_shards=n_shards,
        seed=seed,
        document_order="sequential",
    )
    assert rec.window == 0, "sequential order has no shuffle buffer"
    concatenated = {name: [] for name in rec.names}
    for sid in range(n_shards):
        # Enough lines for two epochs of every dataset (each line starts a document at least
        # every few lines; a document is at most a few lines long here).
        got = starts_per_dataset(info, rec, chain(info, rec, sid), 400)
        for name in rec.names:
            reference = writer_order(info, name)
            mine = got[name]
            epoch = [d for d in reference if d in set(mine)]
            size = len(epoch)
            assert size and mine[:size] == epoch, "the shard's documents are not in stored order"
            assert mine[size : 2 * size] == epoch[: len(mine) - size], "second epoch differs"
            concatenated[name].extend(epoch)
    for name in rec.names:
        assert concatenated[name] == writer_order(info, name)


@settings(max_examples=8, deadline=None)
@given(
    n_shards=st.sampled_from([2, 4]),
    before=st.sampled_from([1, 2, 4]),
    after=st.sampled_from([1, 2, 4]),
    points=st.lists(st.integers(0, 60), min_size=1, max_size=3),
    seed=st.integers(0, 99),
)
def test_sequential_chain_resumes_and_rescales(n_shards, before, after, points, seed):
    info = corpus(scratch_dir(), {"a": 3, "b": 2}, docs_per_file=10)
    rec = recipe(
        info,
        datasets=["a", "b"],
        weights=[1, 1],
        seq_length=20,
        logical_shards=n_shards,
        seed=seed,
        document_order="sequential",
    )
    check_stage_resume(lambda: chain(info, rec, 1), 60, points)
    before, after = min(before, n_shards), min(after, n_shards)
    check_stage_rescale(lambda sid: chain(info, rec, sid), n_shards, before, after, n_shards)


@pytest.mark.parametrize("workers", [0, 2])
def test_sequential_loader_resumes(tmp_path, workers):
    info = corpus(tmp_path, {"a": 2, "b": 2}, docs_per_file=12)
    config = base_config(info, document_order="sequential", num_workers=workers)
    check_resume(lambda: build_dataloader(config, rank=0, world_size=1), 8, (3,))


def test_unknown_document_order_is_refused(tmp_path):
    info = corpus(tmp_path, {"a": 1}, docs_per_file=4)
    with pytest.raises(ConfigError, match="document_order"):
        build_dataloader(base_config(info, document_order="shuffled"), rank=0, world_size=1)


def test_document_order_is_in_the_fingerprint(tmp_path):
    info = corpus(tmp_path, {"a": 2}, docs_per_file=12)
    loader = build_dataloader(
        base_config(info, weights=None, shuffle_window=0), rank=0, world_size=1
    )
    next(iter(loader))
    state = loader.snapshot()
    other = build_dataloader(
        base_config(info, weights=None, shuffle_window=0, document_order="sequential"),
        rank=0,
        world_size=1,
    )
    with pytest.raises(StateMismatchError, match="document_order"):
        other.load_state_dict(state)
