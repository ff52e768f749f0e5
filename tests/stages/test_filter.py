"""Per-document filters and transforms: exact resume and rescale through the shared
checker, exactly the documents the predicate rejects dropped (the predicate applied to
the writer's documents is the reference), and every dropped token counted in the state
and by ``fmsdata state show``."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stagecheck import TokenLines, check_stage_rescale, check_stage_resume
from support import FIRST_TOKEN, PAD, Ledger, base_config, corpus, roundtrip, scratch_dir, take

from fmsdata import ConfigError, build_dataloader
from fmsdata.cli.main import main
from fmsdata.stages import DocumentFilter, DocumentTransform
from fmsdata.stages.outputs import split_document_id
from fmsdata.stages.shard import Shard, default_stages
from fmsdata.state.file import save_state
from fmsdata.worker.materialize import LineWriter


def drop_every_third(tokens, document_id):
    return int(document_id) % 3 != 0


def reverse_and_trim(tokens, document_id):
    return tokens[::-1][: max(len(tokens) - 2, 0)] if document_id % 2 else None


def filtered(shard):
    return DocumentFilter(default_stages(shard), drop_every_third, pad=PAD)


def transformed(shard):
    return DocumentTransform(default_stages(shard), reverse_and_trim, pad=PAD)


CHAINS = {"filter": filtered, "transform": transformed}


def builders(config, stages, n_shards):
    loader = build_dataloader(config, stages=stages)
    context = loader.dataset.shard_context(n_shards)
    pad = config.get("pad_token") if config.get("packing", "hard") != "hard" else None
    writer = LineWriter(
        context.accesses, context.recipe.decoration, config["seq_length"] + 1, pad=pad
    )

    def build(sid=0):
        return TokenLines(stages(Shard(sid, context.recipe, context.accesses)), writer)

    return build, context.close


@settings(max_examples=5, deadline=None)
@given(
    chain=st.sampled_from(sorted(CHAINS)),
    seed=st.integers(0, 3),
    points=st.lists(st.integers(0, 19), min_size=1, max_size=2),
    world=st.sampled_from([(4, 2), (2, 4), (1, 4)]),
    packing=st.sampled_from(["hard", "best_fit"]),
)
def test_filters_resume_and_rescale_through_the_checker(chain, seed, points, world, packing):
    info = corpus(scratch_dir(), {"a": 2, "b": 2}, docs_per_file=12, mean_length=30)
    config = base_config(info, seed=seed, packing=packing, pad_token=PAD, pack_window=5)
    build, close = builders(config, CHAINS[chain], 4)
    try:
        check_stage_resume(build, 20, points)
        check_stage_rescale(build, 4, world[0], world[1], batch_size=4, before_after=(4, 4))
    finally:
        close()


@pytest.mark.parametrize(("workers", "packing"), [(0, "pad"), (2, "pad"), (0, "best_fit")])
def test_the_filter_drops_exactly_the_documents_the_predicate_rejects(tmp_path, workers, packing):
    # Enough documents that no line holds one document twice (from two epochs): the
    # reference names a line's pieces by their document ids.
    info = corpus(tmp_path, {"a": 2, "b": 2}, docs_per_file=40, mean_length=30)
    config = base_config(
        info,
        packing=packing,
        pad_token=PAD,
        pack_window=6,
        num_workers=workers,
        return_document_ids=True,
    )
    plain = take(build_dataloader(config), 10)
    loader = build_dataloader(config, stages=filtered)
    kept = take(loader, 10)
    paths = Ledger(info, config).paths
    dropped_tokens = dropped_pieces = 0
    for a, b in zip(plain, kept):
        for row, ids, frow, fids, labels in zip(
            a["input_ids"].numpy(),
            a["document_ids"].numpy(),
            b["input_ids"].numpy(),
            b["document_ids"].numpy(),
            a["labels"].numpy(),
        ):
            # Reference: the predicate applied to the documents the plain line holds, named
            # by the writer's records (the tokens tell the document).
            line = np.append(row, labels[-1])
            line_ids = np.append(ids, ids[-1] if labels[-1] != -100 else -1)
            expected = []
            for doc_id in dict.fromkeys(line_ids[line_ids >= 0].tolist()):
                piece = line[line_ids == doc_id]
                ds, f, d = (int(x) for x in split_document_id(doc_id))
                firsts, lengths = info.files[paths[ds][f]]
                content = piece[piece >= FIRST_TOKEN]
                assert ((firsts[d] <= content) & (content < firsts[d] + lengths[d])).all()
                if drop_every_third(piece, doc_id):
                    expected.extend(piece.tolist())
                else:
                    dropped_pieces += 1
                    dropped_tokens += len(piece)
            got = frow[fids >= 0].tolist()
            assert got == expected[: len(got)] and len(expected) - len(got) <= 1
            assert (frow[fids < 0] == PAD).all()
    state = roundtrip(loader.snapshot(settle=True))
    counts = {}
    for entry in state["shards"]:
        own = entry["state"]["stages"] if entry["state"] else None
        for key, value in (own or {}).get("counts", {}).items():
            counts[key] = counts.get(key, 0) + int(value)
    assert counts["dropped_pieces"] == dropped_pieces > 0
    assert counts["dropped_tokens"] == dropped_tokens
    assert counts["trimmed_tokens"] == counts["added_tokens"] == 0


def test_state_show_prints_the_filter_counts(tmp_path, capsys):
    info = corpus(tmp_path)
    config = base_config(info)
    loader = build_dataloader(config, stages=filtered)
    take(loader, 5)
    save_state(str(tmp_path / "state.fms"), loader.snapshot(settle=True))
    assert main(["state", "show", str(tmp_path / "state.fms"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    counts = summary["stage_counts"]["DocumentFilter"]
    assert counts["dropped_pieces"] > 0 and counts["lines"] == 5 * config["batch_size"]
    assert main(["state", "show", str(tmp_path / "state.fms")]) == 0
    assert "DocumentFilter" in capsys.readouterr().out


def test_a_transform_must_return_token_ids(tmp_path):
    info = corpus(tmp_path)
    with pytest.raises(ConfigError, match="needs a function"):
        DocumentFilter(None, "not callable")
    with pytest.raises(ConfigError, match="1-d array of token ids"):
        take(build_dataloader(base_config(info), stages=floats), 1)


def to_floats(tokens, document_id):
    return tokens.astype(np.float32)


def floats(shard):
    return DocumentTransform(default_stages(shard), to_floats)
