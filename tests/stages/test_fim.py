"""Fill-in-the-middle: exact resume and rescale through the shared checker, and every
line decodes back to the writer's documents once the sentinels are removed and the
pieces put back in order."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stagecheck import TokenLines, check_stage_rescale, check_stage_resume
from support import BOS, EOS, FIRST_TOKEN, PAD, Ledger, base_config, corpus, scratch_dir, take

from fmsdata import ConfigError, LoaderConfig, build_dataloader
from fmsdata.stages.outputs import split_document_id
from fmsdata.stages.shard import Shard, default_stages
from fmsdata.worker.materialize import LineWriter

PRE, MID, SUF = 8, 9, 10


def fim_config(info, **overrides):
    fim = dict(fim_training=True, psm_rate=0.4, spm_rate=0.4, fim_pre=PRE, fim_mid=MID)
    return base_config(info, **{**fim, "fim_suf": SUF, **overrides})


def builders(config, n_shards):
    """(build a shard's chain as TokenLines, close) for stage-level checks."""
    loader = build_dataloader(config)
    context = loader.dataset.shard_context(n_shards)
    cfg = LoaderConfig(**config)
    writer = LineWriter(
        context.accesses, context.recipe.decoration, cfg.line_length, pad=cfg.lines.line_pad_token
    )

    def build(sid=0):
        return TokenLines(default_stages(Shard(sid, context.recipe, context.accesses)), writer)

    return build, context.close


@settings(max_examples=5, deadline=None)
@given(
    psm=st.sampled_from([0.0, 0.3, 1.0]),
    seed=st.integers(0, 3),
    points=st.lists(st.integers(0, 19), min_size=1, max_size=2),
    world=st.sampled_from([(4, 2), (2, 4), (1, 4)]),
    packing=st.sampled_from(["hard", "best_fit"]),
)
def test_fim_resumes_and_rescales_through_the_checker(psm, seed, points, world, packing):
    info = corpus(scratch_dir(), {"a": 2, "b": 2}, docs_per_file=12, mean_length=30)
    config = fim_config(
        info,
        psm_rate=psm,
        spm_rate=1.0 - psm,
        seed=seed,
        packing=packing,
        pad_token=PAD,
        pack_window=5,
    )
    build, close = builders(config, 4)
    try:
        check_stage_resume(build, 20, points)
        check_stage_rescale(
            build, 4, before=world[0], after=world[1], batch_size=4, before_after=(4, 4)
        )
    finally:
        close()


def decode(piece):
    """A FIM piece back in document order (sentinels removed), or the piece as it is."""
    piece = list(piece)
    if PRE not in piece:
        return piece
    p = piece.index(PRE)
    head, body = piece[:p], piece[p + 1 :]
    if SUF in body and MID in body and body.index(SUF) < body.index(MID):
        s, m = body.index(SUF), body.index(MID)
        # PSM: prefix SUF suffix MID middle; SPM (prefix empty here): SUF suffix MID p+m.
        prefix, suffix, middle = body[:s], body[s + 1 : m], body[m + 1 :]
        tail = [t for t in middle if t in (EOS,)]
        middle = [t for t in middle if t != EOS]
        return head + prefix + middle + suffix + tail
    return [t for t in piece if t not in (PRE, MID, SUF)]  # cut off by the line's end


@pytest.mark.parametrize("packing", ["hard", "pad", "best_fit"])
def test_fim_lines_decode_to_the_documents_as_written(tmp_path, packing):
    info = corpus(tmp_path, {"a": 2, "b": 1}, docs_per_file=16, mean_length=30)
    extra = {"packing": packing, "pad_token": PAD, "pack_window": 7} if packing != "hard" else {}
    config = fim_config(
        info,
        return_document_ids=True,
        return_position_ids=True,
        seq_length=48,
        num_workers=1,
        min_length=1,
        **extra,
    )
    paths = Ledger(info, config).paths
    transformed = 0
    for batch in take(build_dataloader(config), 12):
        # Whole lines: the inputs plus the last target, whose document is the last input's.
        labels = batch["labels"].numpy()
        for inputs, last, row_ids, positions in zip(
            batch["input_ids"].numpy(),
            labels[:, -1],
            batch["document_ids"].numpy(),
            batch["position_ids"].numpy(),
        ):
            row = np.append(inputs, last) if last != -100 else inputs
            row_ids = np.append(row_ids, row_ids[-1]) if last != -100 else row_ids
            starts = np.flatnonzero(positions == 0)  # a document may follow itself
            ends = np.append(starts[1:], len(row))
            content = [k for k in range(len(starts)) if row_ids[starts[k]] != -1]
            for k, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
                if row_ids[a] == -1:
                    assert (row[a:b] == PAD).all()
                    continue
                piece = row[a:b].tolist()
                transformed += PRE in piece
                # Sentinels, BOS, EOS: nothing else is inserted.
                assert all(t >= FIRST_TOKEN or t in (PRE, MID, SUF, BOS, EOS) for t in piece)
                ds, f, d = (int(x) for x in split_document_id(row_ids[a]))
                firsts, lengths = info.files[paths[ds][f]]
                document = list(range(int(firsts[d]), int(firsts[d] + lengths[d])))
                body = [t for t in decode(piece) if t >= FIRST_TOKEN]
                if k == content[-1] and len(row) == config["seq_length"] + 1:
                    # The line's last piece may have lost its end (overflow, or the split).
                    assert len(set(body)) == len(body) and set(body) <= set(document)
                elif k == content[0] or packing == "best_fit":
                    # The rest of a split document: the first piece of a line, or with
                    # best_fit the rest of a document longer than a line, anywhere.
                    assert body == document[len(document) - len(body) :], piece
                else:
                    assert body == document, piece  # a whole document, back in order
    assert transformed > 10


def test_fim_with_rates_zero_changes_nothing_and_sentinels_may_be_omitted(tmp_path):
    info = corpus(tmp_path)
    plain = take(build_dataloader(base_config(info)), 4)
    off = take(build_dataloader(fim_config(info, psm_rate=0.0, spm_rate=0.0)), 4)
    for a, b in zip(plain, off):
        assert (a["input_ids"] == b["input_ids"]).all()
    bare = fim_config(info, psm_rate=1.0, spm_rate=0.0, fim_pre=None, fim_mid=None)
    for batch in take(build_dataloader({**bare, "fim_suf": None}), 2):
        tokens = batch["input_ids"].numpy()
        assert not np.isin(tokens, [PRE, MID, SUF]).any()
    # The same tokens as the plain lines, each line's pieces only reordered.
    for a, b in zip(plain, take(build_dataloader({**bare, "fim_suf": None}), 2)):
        for x, y in zip(lines_of(a), lines_of(b)):
            assert sorted(x) == sorted(y)


def lines_of(batch):
    """Whole lines of a batch without padding: the inputs plus the last target."""
    return np.concatenate([batch["input_ids"], batch["labels"][:, -1:]], axis=1).tolist()


def test_fim_is_world_size_invariant_through_the_loader(tmp_path):
    info = corpus(tmp_path, {"a": 2, "b": 2}, docs_per_file=12, mean_length=30)
    config = fim_config(info, num_workers=1)

    def steps(world, n):
        loaders = [
            build_dataloader({**config, "batch_size": 4 // world}, rank=r, world_size=world)
            for r in range(world)
        ]
        per_rank = [take(loader, n) for loader in loaders]
        return [
            sorted(tuple(row) for b in per_rank for row in b[s]["input_ids"].tolist())
            for s in range(n)
        ]

    assert steps(1, 6) == steps(2, 6) == steps(4, 6)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("psm_rate", 1.5, "psm_rate must be a probability"),
        ("spm_rate", -0.1, "spm_rate must be a probability"),
        ("spm_rate", 0.7, "psm_rate \\+ spm_rate must be at most 1"),
        ("fim_pre", -1, "fim_pre must be a non-negative token id"),
        ("fim_min_length", -2, "fim_min_length must be a non-negative"),
        ("fim_training", "yes", "fim_training must be true or false"),
    ],
)
def test_fim_fields_are_validated(tmp_path, field, value, message):
    with pytest.raises(ConfigError, match=message):
        LoaderConfig(**{"data_path": str(tmp_path), "psm_rate": 0.5, field: value})
