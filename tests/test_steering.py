"""G9 (changing the mix, schedules) and G10 (skipping ahead)."""

import json
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import (
    Ledger,
    assert_same_batches,
    base_config,
    check_exactly_once_per_epoch,
    corpus,
    delivered_truth,
    global_steps,
    rank_loaders,
    roundtrip,
    scratch_dir,
    take,
)

from fmsdata import build_dataloader
from fmsdata.cli.main import main
from fmsdata.errors import StateMismatchError
from fmsdata.state.file import save_state


def shares(info, batches, names):
    tokens = np.concatenate([b["input_ids"].numpy().ravel() for b in batches])
    which = info.dataset_of(tokens)
    which = which[which >= 0]
    counts = np.bincount(which, minlength=len(info.ranges))
    index = [list(info.ranges).index(n) for n in names]
    return counts[index] / counts[index].sum()


def test_new_weights_take_over_and_no_document_repeats(tmp_path):
    info = corpus(tmp_path, {"a": 3, "b": 3}, docs_per_file=80, mean_length=12, spread=0.5)
    config = base_config(
        info,
        weights=[1, 1],
        seq_length=128,
        batch_size=4,
        shuffle_window=1,
        bos_token=None,
        eos_token=None,
    )
    ledger = Ledger(info, config)
    first = rank_loaders(config, 2, batch_size=2)
    for loader in first:
        ledger.add_batches(take(loader, 20))
    states = [roundtrip(loader.snapshot()) for loader in first]
    changed = {**config, "weights": [3, 1]}
    with pytest.raises(StateMismatchError, match="weights"):
        build_dataloader(changed, rank=0, world_size=4).load_state_dict(states)
    second = rank_loaders({**changed, "allow_mix_change": True}, 4, batch_size=1)
    after = []
    for loader in second:
        loader.load_state_dict(states)
        batches = take(loader, 60)
        after.extend(batches)
        ledger.add_batches(batches)
    assert abs(shares(info, after, ["a", "b"])[0] - 0.75) < 0.01
    settled = [loader.snapshot(settle=True) for loader in second]
    for state in settled:
        ledger.add_state(state)
    check_exactly_once_per_epoch(ledger, settled, 4)


def test_adding_and_removing_datasets(tmp_path, caplog):
    info = corpus(tmp_path, {"a": 2, "b": 2, "c": 2}, docs_per_file=40, mean_length=20)
    config = base_config(info, datasets=["a", "b"], weights=[1, 1], shuffle_window=2)
    ledger = Ledger(info, {**config, "datasets": ["a", "b", "c"]})
    loader = build_dataloader(config)
    ledger.add_batches(take(loader, 15))
    state = roundtrip(loader.snapshot())
    # "c" joins at its beginning; "a" and "b" continue from their own positions.
    wider = build_dataloader(
        {**config, "datasets": ["a", "b", "c"], "weights": [1, 1, 2], "allow_mix_change": True}
    )
    wider.load_state_dict(state)
    ledger.add_batches(take(wider, 30))
    settled = wider.snapshot(settle=True)
    ledger.add_state(settled)
    check_exactly_once_per_epoch(ledger, [settled], 4)
    # Dropping "b": a warning, and "b" tokens stop once the buffers have drained.
    narrower = build_dataloader(
        {**config, "datasets": ["a"], "weights": [1], "allow_mix_change": True}
    )
    narrower.load_state_dict(wider.snapshot())
    assert "no longer in the mix" in caplog.text
    later = take(narrower, 40)[10:]
    assert shares(info, later, ["a", "b", "c"])[1] == 0


@settings(max_examples=10)
@given(stop=st.integers(1, 59), linear=st.booleans(), workers=st.sampled_from([0, 1]))
def test_schedule_resumes_exactly_at_any_step(stop, linear, workers):
    info = corpus(scratch_dir(), {"a": 2, "b": 2}, docs_per_file=40, mean_length=20)
    config = base_config(
        info,
        weights=None,
        weight_schedule=[[0, [1, 0]], [3000, [1, 1]], [6000, [0, 1]]],
        schedule_interpolation="linear" if linear else "step",
        schedule_resolution=7,
        num_workers=workers,
    )
    reference = take(build_dataloader(config), 60)
    head = build_dataloader(config)
    take(head, stop)
    resumed = build_dataloader(config)
    resumed.load_state_dict(roundtrip(head.snapshot()))
    assert_same_batches(reference[stop:], take(resumed, 60 - stop))


def test_schedule_moves_the_shares(tmp_path):
    info = corpus(tmp_path, {"a": 3, "b": 3}, docs_per_file=60, mean_length=10, spread=0.3)
    config = base_config(
        info,
        weights=None,
        weight_schedule=[[0, [1, 0]], [40, [0, 1]]],
        schedule_unit="steps",
        global_batch_size=4,
        shuffle_window=0,
        bos_token=None,
        eos_token=None,
    )
    batches = take(build_dataloader(config), 80)
    assert shares(info, batches[:38], ["a", "b"])[0] == 1.0
    assert shares(info, batches[42:], ["a", "b"])[1] == 1.0


def test_skip_drops_exactly_those_steps(tmp_path):
    info = corpus(tmp_path)
    config = base_config(info, num_workers=2)
    reference = take(build_dataloader(config), 50)
    loader = build_dataloader(config)
    got = take(loader, 7)
    loader.skip(11)
    got += take(loader, 12)
    assert_same_batches(reference[:7] + reference[18:30], got)
    assert loader.snapshot()["skips"] == [[7, 11]] and loader.steps == 30
    # The skip is in the state: a resume, also on two ranks, continues after it.
    resumed = build_dataloader(config)
    resumed.load_state_dict(roundtrip(loader.snapshot()))
    assert_same_batches(reference[30:40], take(resumed, 10))


def test_skip_during_an_iteration(tmp_path):
    info = corpus(tmp_path)
    config = base_config(info, num_workers=1)
    reference = take(build_dataloader(config), 40)
    loader = build_dataloader(config)
    got = []
    for batch in loader:
        got.append(batch)
        if len(got) == 5:
            loader.skip(10)
        if len(got) == 20:
            break
    assert_same_batches(reference[:5] + reference[15:30], got)


def test_skip_then_rescale(tmp_path):
    info = corpus(tmp_path)
    config = base_config(info, logical_shards=8)
    reference = global_steps(rank_loaders(config, 2, batch_size=4), 30)
    loaders = rank_loaders(config, 2, batch_size=4)
    assert global_steps(loaders, 4) == reference[:4]
    for loader in loaders:
        loader.skip(6)
    states = [roundtrip(loader.snapshot()) for loader in loaders]
    wider = rank_loaders(config, 4, batch_size=2)
    for loader in wider:
        loader.load_state_dict(states)
    assert global_steps(wider, 10) == reference[10:20]


def test_skip_from_the_config_applies_once(tmp_path):
    info = corpus(tmp_path)
    config = base_config(info)
    reference = take(build_dataloader(config), 40)
    first = build_dataloader(config)
    take(first, 5)
    state = roundtrip(first.snapshot())
    skipping = {**config, "skip_steps": [[8, 4]]}
    resumed = build_dataloader(skipping)
    resumed.load_state_dict(state)
    assert_same_batches(reference[5:8] + reference[12:20], take(resumed, 11))
    again = build_dataloader(skipping)
    again.load_state_dict(roundtrip(resumed.snapshot()))  # the skip is recorded: not repeated
    assert_same_batches(reference[20:30], take(again, 10))


# -- skip(k) inside a running loop -----------------------------------------------------

SKIP_CORPUS = {}


def skip_setup():
    """A corpus, its config and the uninterrupted run's batches, built once."""
    if not SKIP_CORPUS:
        info = corpus(scratch_dir(), docs_per_file=30)
        config = base_config(info, shuffle_window=3)
        SKIP_CORPUS.update(info=info, config=config, reference=take(build_dataloader(config), 1000))
    return SKIP_CORPUS["config"], SKIP_CORPUS["reference"]


def run_with_skips(loader, skips, n_batches):
    """Iterate, calling ``skip(skips[i])`` right after the ``i``-th batch; returns the
    batches, the reference step each should be, and the skips as the state records them."""
    got, expected, recorded, position = [], [], [], loader.steps
    for batch in loader:
        got.append(batch)
        expected.append(position)
        position += 1
        if len(got) == n_batches:
            break
        k = skips.get(len(got), 0)
        loader.skip(k)
        if k:
            recorded.append([position, k])
        position += k
    return got, expected, recorded


def check_skipped_run(config, reference, skips, n_batches, workers):
    loader = build_dataloader({**config, "num_workers": workers})
    got, expected, recorded = run_with_skips(loader, skips, n_batches)
    assert_same_batches([reference[s] for s in expected], got)
    assert loader.snapshot()["skips"] == recorded
    assert loader.steps == expected[-1] + 1
    return loader


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_skip_inside_the_loop_at_every_step(workers):
    """A skip called after any batch (worker-item boundaries are after batches 1, 3, 7,
    15, 31, 63 and 127) takes effect at once, short or longer than what is prefetched."""
    config, reference = skip_setup()
    sizes = [1, 2, 0, 3, 1, 5, 1, 30]
    skips = {step: sizes[step % len(sizes)] for step in range(1, 131)}
    check_skipped_run(config, reference, skips, 131, workers)


@settings(max_examples=12)
@given(
    skips=st.dictionaries(st.integers(1, 130), st.integers(1, 140), min_size=1, max_size=5),
    workers=st.sampled_from([0, 1, 2]),
    ranks=st.sampled_from([1, 2]),
)
def test_skips_inside_the_loop_then_resume_or_rescale(skips, workers, ranks):
    config, reference = skip_setup()
    n_batches = max(skips) + 3
    loader = check_skipped_run(config, reference, skips, n_batches, workers)
    state = roundtrip(loader.snapshot())
    at = loader.steps
    resumed = rank_loaders(config, ranks, batch_size=config["batch_size"] // ranks)
    for rank_loader in resumed:
        rank_loader.load_state_dict(state)
        assert rank_loader.steps == at
    rows = [sorted(map(tuple, b["input_ids"].tolist())) for b in reference[at : at + 8]]
    assert global_steps(resumed, 8) == rows


# -- linear schedules follow their integral ---------------------------------------------

RAMP_CORPORA = {}


def ramp_corpus(mean_length):
    if mean_length not in RAMP_CORPORA:
        RAMP_CORPORA[mean_length] = corpus(
            scratch_dir(),
            {"a": 2, "b": 2},
            docs_per_file=max(40, 12000 // mean_length),
            mean_length=mean_length,
            spread=0.5,
        )
    return RAMP_CORPORA[mean_length]


def scheduled_share(points, resolution, clock):
    """Share of dataset ``a`` at each clock value, spelled out from the config: linear
    between points on a grid of ``resolution`` cells, the end points' weights outside."""
    (x0, w0), (x1, w1) = points
    w0, w1 = np.asarray(w0, dtype=float), np.asarray(w1, dtype=float)
    cell = np.clip(np.floor((clock - x0) / (x1 - x0) * resolution), 0, resolution - 1)
    weights = w0[None, :] + (w1 - w0)[None, :] * (cell / resolution)[:, None]
    weights[clock >= x1] = w1
    return weights[:, 0] / weights.sum(axis=1)


@pytest.mark.parametrize("ramp", [(0.8, 0.2), (0.8, 0.8)])
@pytest.mark.parametrize("resolution", [1, 3, 100, 1000])
@pytest.mark.parametrize("mean_length", [6, 30, 150])
def test_linear_schedule_follows_its_integral(ramp, resolution, mean_length):
    """With one logical shard, no shuffling and no delimiters, the shard's clock after
    ``n`` lines is ``n * (seq_length + 1)``: the tokens of ``a`` in those lines must stay
    within a document of the integral of its scheduled share, at every line."""
    info = ramp_corpus(mean_length)
    seq, lines = 63, 480
    start, end = 1000, 25000
    points = [[start, [ramp[0], 1 - ramp[0]]], [end, [ramp[1], 1 - ramp[1]]]]
    config = base_config(
        info,
        weights=None,
        weight_schedule=points,
        schedule_interpolation="linear",
        schedule_resolution=resolution,
        seq_length=seq,
        batch_size=8,
        logical_shards=1,
        shuffle_window=0,
        bos_token=None,
        eos_token=None,
    )
    batches = take(build_dataloader(config), lines // 8)
    rows = np.concatenate(
        [torch.cat([b["input_ids"], b["labels"][:, -1:]], dim=1).numpy() for b in batches]
    )
    is_a = info.dataset_of(rows) == 0
    realised = np.cumsum(is_a.sum(axis=1))
    clock = np.arange(lines * (seq + 1))
    target = np.cumsum(scheduled_share(points, resolution, clock + 0.5))
    target = target[(seq + 1) * np.arange(1, lines + 1) - 1]
    longest = max(int(lengths.max()) for _, lengths in info.files.values())
    assert np.abs(realised - target).max() <= longest + 1
    # Per window of 60 lines, the share is the schedule's within what two documents allow.
    window = 60
    got = np.diff(np.concatenate([[0], realised[window - 1 :: window]])) / (window * (seq + 1))
    want = np.diff(np.concatenate([[0], target[window - 1 :: window]])) / (window * (seq + 1))
    assert np.abs(got - want).max() <= 2 * (longest + 1) / (window * (seq + 1)) + 1e-9


@settings(max_examples=15)
@given(
    seq_length=st.sampled_from([16, 23, 31, 40]),
    shards_per_rank=st.sampled_from([1, 2]),
    world=st.sampled_from([1, 2]),
    lines_per_shard=st.integers(1, 3),
    delimiters=st.booleans(),
    packing=st.sampled_from(["hard", "pad"]),
    at=st.integers(2, 40),
)
def test_a_steps_point_takes_effect_at_its_step(
    seq_length, shards_per_rank, world, lines_per_shard, delimiters, packing, at
):
    """A switch from ``a`` to ``b`` at step ``at``: no ``b`` token before that step; with
    hard packing the batch of step ``at`` (counted from 0) already holds ``b`` (documents
    are shorter than a line, so the line that starts the step starts a ``b`` document)."""
    info = STEP_CORPUS.get("info") or STEP_CORPUS.setdefault(
        "info",
        corpus(scratch_dir(), {"a": 2, "b": 2}, docs_per_file=300, mean_length=4, spread=0.3),
    )
    shards = shards_per_rank * world
    config = base_config(
        info,
        weights=None,
        weight_schedule=[[0, [1, 0]], [at, [0, 1]]],
        schedule_unit="steps",
        global_batch_size=shards * lines_per_shard,
        seq_length=seq_length,
        logical_shards=shards,
        shuffle_window=0,
        bol_token=3 if delimiters else None,
        eol_token=4 if delimiters else None,
        packing=packing,
        pad_token=5,
    )
    loaders = rank_loaders(config, world, batch_size=shards_per_rank * lines_per_shard)
    per_rank = [take(loader, at + 2) for loader in loaders]
    has_b = [
        any(
            (info.dataset_of(batches[step]["input_ids"].numpy()) == 1).any() for batches in per_rank
        )
        for step in range(at + 2)
    ]
    assert not any(has_b[:at]), has_b.index(True)
    if packing == "hard":
        assert has_b[at]


STEP_CORPUS = {}


def test_a_changed_dataset_list_is_refused_by_name(tmp_path):
    info = corpus(tmp_path, {"a": 1, "b": 1, "c": 1})
    config = base_config(info, datasets=["a", "b"], weights=[1, 1])
    loader = build_dataloader(config)
    take(loader, 3)
    state = roundtrip(loader.snapshot())
    cases = {
        ("a", "c"): r"added \['c'\], removed \['b'\]",
        ("a", "b", "c"): r"added \['c'\] \(",
        ("a",): r"removed \['b'\] \(",
        ("b", "a"): "same datasets in another order",
    }
    for names, change in cases.items():
        other = build_dataloader({**config, "datasets": list(names), "weights": [1] * len(names)})
        with pytest.raises(StateMismatchError) as err:
            other.load_state_dict(state)
        message = str(err.value)
        assert re.search(f"the datasets field changed since the state was saved: {change}", message)
        assert "set allow_mix_change: true" in message
        assert "data=" not in message and "files" not in message
    reweighted = build_dataloader({**config, "weights": [3, 1]})
    with pytest.raises(StateMismatchError, match="weights=.*set allow_mix_change: true"):
        reweighted.load_state_dict(state)


# -- state show: what was delivered ------------------------------------------------------


@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("skip", [0, 3])
def test_state_show_counts_what_was_delivered(tmp_path, capsys, window, workers, skip):
    info = corpus(tmp_path / "data", docs_per_file=100)
    config = base_config(
        info, shuffle_window=window, num_workers=workers, bos_token=None, eos_token=None
    )
    reference = take(build_dataloader(config), 30)
    loader = build_dataloader(config)
    got = take(loader, 6)  # mid-item with a worker: lines past the recorded state
    loader.skip(skip)
    got += take(loader, 5)
    delivered = got + reference[6 : 6 + skip]  # skipped lines are passed over: counted too
    truth = delivered_truth(info, config, delivered)
    saved = roundtrip(loader.snapshot())
    save_state(str(tmp_path / "state.fms"), saved)
    (tmp_path / "config.json").write_text(json.dumps(config))

    # With the config, lines emitted after a recorded state are replayed: exact.
    assert (
        main(
            [
                "state",
                "show",
                str(tmp_path / "state.fms"),
                "--json",
                "--config",
                str(tmp_path / "config.json"),
            ]
        )
        == 0
    )
    exact = json.loads(capsys.readouterr().out)
    assert exact["lines"] == (11 + skip) * config["batch_size"] and exact["uncounted_lines"] == 0
    for name, want in truth.items():
        got_counts = exact["datasets"][name]
        assert (got_counts["tokens"], got_counts["docs"]) == (want["tokens"], want["docs"]), name
        for unit in ("tokens", "docs"):
            assert got_counts[f"delivered_{unit}"] == (
                got_counts[f"taken_{unit}"]
                - got_counts[f"buffered_{unit}"]
                - got_counts[f"unsent_{unit}"]
            )
    buffered = sum(d["buffered_tokens"] for d in exact["datasets"].values())
    assert (buffered > 0) == (window > 0)
    # Without it, the lines past a recorded state are named and left out, never guessed.
    assert main(["state", "show", str(tmp_path / "state.fms")]) == 0
    text = capsys.readouterr().out
    advance = sum(entry["advance"] for entry in saved["shards"])
    assert advance > 0  # a worker item was in flight
    assert f"lines delivered: {(11 + skip) * config['batch_size']:,}" in text
    assert (f"note: {advance:,} of {(11 + skip) * config['batch_size']:,} lines" in text) == (
        advance > 0
    )
