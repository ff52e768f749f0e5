"""``packing: best_fit`` through the loader: documents cut only when longer than a line and
only at line ends (read from the tokens, which encode where they came from), padding
ignored by the loss, exact resume with 0, 1 and 2 workers, the same global steps on 1, 2
and 4 ranks and across a rescale, every token once per epoch, token shares, a mix change
on resume, and what ``fmsdata state show`` says."""

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import (
    FIRST_TOKEN,
    PAD,
    Ledger,
    assert_same_batches,
    base_config,
    check_exactly_once_per_epoch,
    check_resume,
    corpus,
    delivered_truth,
    global_steps,
    rank_loaders,
    roundtrip,
    scratch_dir,
    take,
)

from fmsdata import build_dataloader
from fmsdata.cli.state import summarize
from fmsdata.state.file import save_state


def best_fit(info, **overrides):
    return base_config(
        info, **{"packing": "best_fit", "pad_token": PAD, "pack_window": 8, **overrides}
    )


def lines_of(batch):
    """Each row's whole line: the inputs and the last target (padding where it is ignored)."""
    last = batch["labels"][:, -1:].clone()
    last[last == -100] = PAD
    return torch.cat([batch["input_ids"], last], dim=1).numpy()


def document_index(info):
    """Token value -> (document number, offset in it), and each document's length."""
    end = max(stop for _, stop in info.ranges.values())
    owner = np.full(end, -1, dtype=np.int64)
    offset = np.zeros(end, dtype=np.int64)
    lengths = []
    for firsts, sizes in info.files.values():
        for first, size in zip(firsts.tolist(), sizes.tolist()):
            owner[first : first + size] = len(lengths)
            offset[first : first + size] = np.arange(size)
            lengths.append(size)
    return owner, offset, np.array(lengths)


def pieces(line, owner, offset):
    """The line's document pieces ``(document, first offset, length)``: runs of consecutive
    tokens of one document (a document's copy from the next epoch starts a new run)."""
    out = []
    for token in line.tolist():
        if token < FIRST_TOKEN:
            continue
        doc, at = int(owner[token]), int(offset[token])
        if out and out[-1][0] == doc and out[-1][1] + out[-1][2] == at:
            out[-1][2] += 1
        else:
            out.append([doc, at, 1])
    return out


@settings(max_examples=15, deadline=None)
@given(
    seq_length=st.integers(7, 70),
    mean=st.integers(2, 150),
    window=st.integers(1, 40),
    seed=st.integers(0, 1000),
)
def test_documents_are_cut_only_when_longer_than_a_line_and_only_at_line_ends(
    seq_length, mean, window, seed
):
    info = corpus(scratch_dir(), {"a": 2, "b": 1}, docs_per_file=20, mean_length=mean)
    config = best_fit(
        info,
        seq_length=seq_length,
        pack_window=window,
        seed=seed,
        bos_token=None,
        eos_token=None,  # every content token is a corpus token: its document and offset
    )
    owner, offset, lengths = document_index(info)
    capacity = seq_length + 1
    for batch in take(build_dataloader(config), 12):
        for line, labels in zip(lines_of(batch), batch["labels"].numpy()):
            content = int((line != PAD).sum())
            assert (line[content:] == PAD).all() and (line[:content] >= FIRST_TOKEN).all()
            assert (labels[content - 1 :] == -100).all() and (labels[: content - 1] != -100).all()
            for doc, start, length in pieces(line, owner, offset):
                if lengths[doc] <= capacity:
                    assert (start, length) == (0, lengths[doc]), "a document that fits was cut"
                else:
                    assert start % capacity == 0, "a long document cut inside a line"
                    assert length == min(capacity, lengths[doc] - start)


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_resume_is_exact(tmp_path, workers):
    info = corpus(tmp_path, mean_length=25)
    config = best_fit(info, num_workers=workers, return_position_ids=True, return_cu_seqlens=True)
    # By batch 60 each shard has passed an epoch of a dataset (the last point lies across
    # an epoch boundary); windows of 8 documents make about 2 lines each.
    check_resume(lambda: build_dataloader(config), total=70, points=[0, 1, 5, 23, 60])


def test_the_same_global_steps_on_1_2_and_4_ranks_and_across_a_rescale(tmp_path):
    info = corpus(tmp_path, mean_length=25)
    config = best_fit(info, logical_shards=8)
    one = global_steps(rank_loaders(config, 1, batch_size=8, num_workers=0), 14)
    two = global_steps(rank_loaders(config, 2, batch_size=4, num_workers=2), 14)
    four = global_steps(rank_loaders(config, 4, batch_size=2, num_workers=1), 14)
    assert one == two == four
    before = rank_loaders(config, 4, batch_size=2)
    assert global_steps(before, 5) == one[:5]
    states = [roundtrip(loader.snapshot()) for loader in before]
    for world in (1, 2):
        after = rank_loaders(config, world, batch_size=8 // world)
        for loader in after:
            loader.load_state_dict(states)
        assert global_steps(after, 9) == one[5:]


@pytest.mark.parametrize("workers", [0, 2])
def test_every_token_once_per_epoch_across_a_resume_and_a_rescale(tmp_path, workers):
    info = corpus(tmp_path, {"a": 2, "b": 1}, docs_per_file=20, mean_length=30)
    config = best_fit(info, logical_shards=4, pack_window=5, num_workers=workers)
    ledger = Ledger(info, config)
    first = rank_loaders(config, 2, batch_size=2)
    for loader in first:
        ledger.add_batches(take(loader, 13))
    states = [roundtrip(loader.snapshot()) for loader in first]
    second = rank_loaders(config, 1, batch_size=4)
    second[0].load_state_dict(states)
    ledger.add_batches(take(second[0], 31))
    settled = second[0].snapshot(settle=True)
    ledger.add_state(settled)
    check_exactly_once_per_epoch(ledger, [settled], 4)
    assert ledger.counts.max() >= 2  # past an epoch


def test_a_mix_change_on_resume_keeps_every_token_once(tmp_path):
    """Resumed with a dataset added in front and the weights changed: the lines the
    packers hold (their datasets renumbered) come out or stay held, and every document
    taken is seen whole exactly once, delivered or held."""
    info = corpus(tmp_path, {"a": 2, "b": 2, "c": 1}, docs_per_file=100, mean_length=20)
    config = best_fit(info, datasets=["a", "b"], weights=[1.0, 1.0], logical_shards=2)
    head = build_dataloader(config)
    seen = take(head, 6)
    state = roundtrip(head.snapshot())
    changed = {**config, "datasets": ["c", "a", "b"], "weights": [1.0, 1.0, 2.0]}
    resumed = build_dataloader({**changed, "allow_mix_change": True})
    resumed.load_state_dict(state)
    seen += take(resumed, 12)
    ledger = Ledger(info, changed)
    ledger.add_batches(seen)
    settled = resumed.snapshot(settle=True)
    ledger.add_state(settled, every_stage=True)
    assert ledger.counts.max() == 1  # one epoch here: nothing twice
    owner, _, lengths = document_index(info)
    tokens = np.flatnonzero(ledger.counts) + FIRST_TOKEN
    touched = np.bincount(owner[tokens], minlength=len(lengths))
    assert ((touched == 0) | (touched == lengths)).all()  # whole documents only
    assert (ledger.dataset_tokens("c") > 0).any()  # the new dataset is mixed in


@pytest.mark.parametrize("packing", ["hard", "best_fit"])
def test_token_shares_track_the_weights(tmp_path, packing):
    """G5: after a few lines per shard the delivered shares are within 1% of the weights
    (best_fit reorders documents within two windows of each shard: a small window here)."""
    info = corpus(tmp_path, {n: 2 for n in "abc"}, docs_per_file=60, mean_length=12, spread=0.5)
    weights = [0.3, 2.0, 4.0]
    for seed in range(4):
        config = best_fit(
            info,
            packing=packing,
            pack_window=16,
            weights=weights,
            seed=seed,
            seq_length=256,
            batch_size=8,
            shuffle_window=2,
            bos_token=None,
            eos_token=None,
        )
        batches = take(build_dataloader(config), 6)
        tokens = np.concatenate([b["input_ids"].numpy().ravel() for b in batches])
        tokens = tokens[tokens >= FIRST_TOKEN]
        shares = np.bincount(info.dataset_of(tokens), minlength=3) / len(tokens)
        assert np.abs(shares - np.array(weights) / sum(weights)).max() < 0.01, shares


def test_state_show_counts_exactly_and_reports_the_packing(tmp_path, capsys):
    from fmsdata.cli.main import main

    info = corpus(tmp_path / "data", {"a": 2, "b": 1}, docs_per_file=30, mean_length=30)
    config = best_fit(
        info, logical_shards=2, shuffle_window=3, pack_window=6, bos_token=None, eos_token=None
    )
    loader = build_dataloader(config)
    batches = take(loader, 9)
    state = loader.snapshot(settle=True)
    summary = summarize([state])
    truth = delivered_truth(info, config, batches)
    for name in ("a", "b"):
        got = summary["datasets"][name]
        assert (got["tokens"], got["docs"]) == (truth[name]["tokens"], truth[name]["docs"])
    (label,) = [label for label in summary["stage_counts"] if label.startswith("BestFitPacker")]
    counts, ratios = summary["stage_counts"][label], summary["stage_ratios"][label]
    lines = int(state["shards"][0]["state"]["emitted"]) + int(
        state["shards"][1]["state"]["emitted"]
    )
    assert counts["lines"] >= lines  # closed: handed out or ready
    assert ratios["padding_fraction"] == counts["padding_tokens"] / counts["line_tokens"]
    assert ratios["documents_per_line"] == counts["document_pieces"] / counts["lines"]
    save_state(str(tmp_path / "state.fms"), state)
    assert main(["state", "show", str(tmp_path / "state.fms"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["stage_ratios"][label] == ratios
    assert main(["state", "show", str(tmp_path / "state.fms")]) == 0
    text = capsys.readouterr().out
    assert f"padding_fraction {ratios['padding_fraction']:.4g}" in text
    assert f"cut_documents {counts['cut_documents']:,}" in text


def test_batches_made_in_workers_are_the_batches_made_in_process(tmp_path):
    info = corpus(tmp_path, mean_length=25)
    config = best_fit(info, return_document_ids=True)
    reference = take(build_dataloader({**config, "num_workers": 0}), 30)
    for workers in (1, 3):
        assert_same_batches(
            reference, take(build_dataloader({**config, "num_workers": workers}), 30)
        )
