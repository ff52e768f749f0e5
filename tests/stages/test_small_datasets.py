"""Small datasets with many logical shards: each epoch a shard reads another shard's portion
(rotation), so a line repeats no document while the dataset has others, and every pass
over all shards still covers every document once."""

from chains import chain, check_rotating_passes, documents_by_epoch, recipe, writer_order
from hypothesis import given, settings
from hypothesis import strategies as st
from stagecheck import check_stage_rescale, check_stage_resume
from support import accesses, corpus, scratch_dir

from fmsdata.stages.documents import Decoration, RandomWalk, stream_class
from fmsdata.stages.spans import DOC, DS, FILE, START

SHARDS = 1024
SEQ = 32  # 33 tokens per line: the budget is 1024 * 33 tokens per dataset


def issue_mix(root):
    """~1,100 short documents ("s", one file, ~3.3k tokens: rotates) at weight 0.5 with a
    dataset of ~53k tokens ("big", does not rotate)."""
    info = corpus(root, {"s": 1, "big": 16}, docs_per_file=1100, mean_length=3, spread=0.3)
    rec = recipe(
        info, datasets=["s", "big"], weights=[0.5, 0.5], seq_length=SEQ, logical_shards=SHARDS
    )
    return info, rec


def test_no_document_starts_twice_in_a_line():
    info, rec = issue_mix(scratch_dir())
    for sid in (0, 1, 511, 1023):
        stage = chain(info, rec, sid)
        starts = 0
        for _ in range(100):
            line = next(stage).tolist()
            small = [(s[FILE], s[DOC]) for s in line if s[DS] == 0 and s[START] == 0]
            assert len(set(small)) == len(small), f"shard {sid}: a document starts twice"
            starts += len(small)
        assert starts > 300, "several of its documents per line: a repeat was possible"


def test_every_pass_over_the_shards_covers_the_small_dataset_once():
    info, rec = issue_mix(scratch_dir())
    access = accesses(info, ["s"])[0]
    reference = sorted(writer_order(info, "s"))
    ref = [(path, d) for _, path, d in reference]
    passes = {e: [] for e in (1022, 1023, 1024, 1025)}
    for sid in range(SHARDS):
        # Passes across the end of each shard's first cycle of 1024 epochs (the first
        # passes are checked for smaller shapes below).
        stream = RandomWalk(access, sid, SHARDS, rec.seed, Decoration(), SEQ + 1)
        stream.load_state_dict(
            {"epoch": 1022, "pos": 0, "docs": 0, "tokens": 0, "skipped": 0, "size": len(reference)}
        )
        for epoch, docs in documents_by_epoch(stream, 1026).items():
            passes[epoch].extend(docs)
    for epoch, docs in passes.items():
        assert sorted(docs) == ref, f"pass {epoch} does not cover every document once"


@settings(max_examples=15, deadline=None)
@given(
    n_shards=st.integers(2, 40),
    files=st.integers(1, 2),
    docs=st.integers(1, 12),
    order=st.sampled_from(["random", "sequential"]),
    seed=st.integers(0, 99),
)
def test_passes_cover_every_document_once_for_any_shape(n_shards, files, docs, order, seed):
    """Also with fewer documents than shards (some portions empty) and either order."""
    info = corpus(scratch_dir(), {"s": files}, docs_per_file=docs, mean_length=3)
    passes = check_rotating_passes(info, stream_class(order), n_shards, seed)
    if order == "sequential":  # first pass: shards in order give the stored order
        assert passes[0] == [(path, d) for _, path, d in writer_order(info, "s")]


@settings(max_examples=3, deadline=None)
@given(
    before=st.sampled_from([1, 2, 4, 8]),
    after=st.sampled_from([1, 2, 4, 8]),
    points=st.lists(st.integers(0, 40), min_size=1, max_size=2),
    order=st.sampled_from(["random", "sequential"]),
)
def test_rotating_chains_resume_and_rescale(before, after, points, order):
    info = corpus(scratch_dir(), {"s": 1, "big": 2}, docs_per_file=30, mean_length=4)
    rec = recipe(
        info,
        datasets=["s", "big"],
        weights=[1, 1],
        seq_length=20,
        logical_shards=8,
        document_order=order,
    )
    # "s" (~120 tokens) rotates; "big" (~240 tokens) does too at this budget (8 * 21).
    check_stage_resume(lambda: chain(info, rec, 3), 40, points)
    check_stage_rescale(lambda sid: chain(info, rec, sid), 8, before, after, 8)
