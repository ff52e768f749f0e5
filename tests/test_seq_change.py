"""A seq_length change on resume (long-context extension): ``allow_changes=["seq_length"]``.

Every document keeps its position (each token once per epoch across the change, counted
from the token values, which encode their document and position), the lines the state
held are re-packed to the new length, and the run after the change is exact and the same
on any world size and number of workers (docs/guide/resume.md).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import (
    EOS,
    PAD,
    Ledger,
    base_config,
    check_exactly_once_per_epoch,
    corpus,
    global_steps,
    rank_loaders,
    roundtrip,
    scratch_dir,
    take,
)

from fmsdata import build_dataloader
from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.stages.base import LineChange, Stage
from fmsdata.stages.filter import DocumentFilter
from fmsdata.stages.savedchain import stage_state
from fmsdata.stages.shard import default_stages

PACKINGS = ["hard", "pad", "best_fit"]


def _config(info, seq, packing="hard", **overrides):
    return base_config(info, seq_length=seq, packing=packing, pad_token=PAD, **overrides)


def _saved_at(config, steps, world_size=1):
    """Every rank's state after ``steps`` batches at ``config``, and the batches."""
    loaders = rank_loaders(config, world_size)
    batches = [take(loader, steps) for loader in loaders]
    return [roundtrip(loader.snapshot()) for loader in loaders], batches


def _check_coverage(info, old, new, steps_before, steps_after, allow=("seq_length",)):
    """Run ``steps_before`` at ``old``, resume at ``new``, run ``steps_after``: every token
    of every document read so far is delivered or held exactly once per epoch."""
    ledger = Ledger(info, new)
    states, batches = _saved_at(old, steps_before)
    ledger.add_batches(batches[0])
    loader = build_dataloader(new)
    loader.load_state_dict(states, allow_changes=list(allow))
    after = take(loader, steps_after)
    for batch in after:
        assert batch["input_ids"].shape[1] == new["seq_length"]
    ledger.add_batches(after)
    final = loader.snapshot(settle=True)
    ledger.add_state(final, every_stage=True)
    check_exactly_once_per_epoch(ledger, [final], new["logical_shards"])
    return after, final


@pytest.mark.parametrize("packing", PACKINGS)
@pytest.mark.parametrize("seqs", [(32, 96), (64, 20)], ids=["longer", "shorter"])
def test_every_token_once_across_the_change(tmp_path, packing, seqs):
    info = corpus(tmp_path, mean_length=30)
    old, new = (_config(info, s, packing, shuffle_window=12) for s in seqs)
    after, _ = _check_coverage(info, old, new, 5, 9)
    if packing == "hard":  # the new lines are full lines of the new length
        for batch in after:
            assert not (batch["input_ids"] == PAD).any()


def test_buffered_lines_come_first_at_the_new_length(tmp_path):
    """Without a shuffle the packer's carry (the rest of a split document) starts the first
    line at the new length; with one, the buffered lines' documents come out before any
    document read after the change (here: they all fit the first batches)."""
    info = corpus(tmp_path, mean_length=30)
    old, new = (_config(info, s, shuffle_window=0, logical_shards=1) for s in (32, 80))
    states, _ = _saved_at(old, 3)
    carry = stage_state(states[0]["shards"][0]["state"], states[0]["fingerprint"], "packer")
    ds, file, doc, start, length = carry["carry"]
    loader = build_dataloader(new)
    loader.load_state_dict(states, allow_changes=["seq_length"])
    first = take(loader, 1)[0]["input_ids"][0].numpy()
    ledger = Ledger(info, new)
    rest = ledger.span_tokens(ds, file, doc, start, length)
    assert np.array_equal(first[first >= 16][: len(rest)], rest)


@pytest.mark.parametrize("packing", PACKINGS)
def test_same_global_steps_on_any_world_size_after_the_change(tmp_path, packing):
    info = corpus(tmp_path, mean_length=30)
    old, new = (_config(info, s, packing, shuffle_window=8) for s in (32, 72))
    states, _ = _saved_at(old, 4, world_size=2)

    def resumed(world_size, workers):
        loaders = rank_loaders(new, world_size, batch_size=4 // world_size, num_workers=workers)
        for loader in loaders:
            loader.load_state_dict(states, allow_changes=["seq_length"])
        return global_steps(loaders, 6)

    reference = resumed(1, 0)
    assert resumed(2, 0) == reference
    assert resumed(1, 2) == reference
    assert resumed(2, 1) == reference


@pytest.mark.parametrize("packing", ["hard", "pad"])
def test_resume_after_the_change_is_exact(tmp_path, packing):
    """The hard and pad packers hold the re-packed pieces as a carry of several spans
    until they are in lines: a state saved meanwhile resumes exactly."""
    info = corpus(tmp_path, mean_length=30)
    old, new = (_config(info, s, packing, shuffle_window=40) for s in (48, 16))
    states, _ = _saved_at(old, 12)

    def fresh():
        loader = build_dataloader(new)
        loader.load_state_dict(states, allow_changes=["seq_length"])
        return loader

    reference = take(fresh(), 8)
    several = False
    for k in (1, 2, 5):
        first = fresh()
        take(first, k)
        state = roundtrip(first.snapshot())
        for entry in state["shards"]:
            packer = stage_state(entry["state"], state["fingerprint"], "packer")
            several |= len(packer["carry"]) > 5
        again = build_dataloader(new)
        again.load_state_dict(state)  # saved at the new length: nothing to allow
        for a, b in zip(reference[k:], take(again, 8 - k)):
            assert a["input_ids"].equal(b["input_ids"])
    assert several, "no state was saved while the carry held several pieces"


@settings(max_examples=10, deadline=None)
@given(
    old=st.integers(8, 64),
    new=st.integers(8, 64),
    packing=st.sampled_from(PACKINGS),
    steps=st.integers(0, 12),
    window=st.integers(0, 12),
)
def test_coverage_property(old, new, packing, steps, window):
    info = corpus(scratch_dir(), {"a": 2, "b": 1}, docs_per_file=15, mean_length=20)
    before, after = (_config(info, s, packing, shuffle_window=window) for s in (old, new))
    _check_coverage(info, before, after, steps, 6)


def test_refusal_names_the_one_thing_to_pass(tmp_path):
    info = corpus(tmp_path)
    states, _ = _saved_at(_config(info, 32), 3)
    for allow in ([], ["capacity"], ["capacity", "line_tokens", "line_length"]):
        loader = build_dataloader(_config(info, 64))
        with pytest.raises(StateMismatchError) as refused:
            loader.load_state_dict(states, allow_changes=allow)
        message = str(refused.value)
        assert "allow_changes=['seq_length']" in message
        assert "seq_length=32" in message and "seq_length=64" in message
        assert "capacity" not in message and "line_length" not in message


def test_with_a_mix_change_at_the_same_time(tmp_path):
    info = corpus(tmp_path, mean_length=30)
    old = _config(info, 32, shuffle_window=6)
    new = _config(info, 64, shuffle_window=6, weights=[1.0, 3.0], allow_mix_change=True)
    _check_coverage(info, old, new, 5, 8)


def test_fim_across_the_change(tmp_path):
    """Fill-in-the-middle keeps its line count (its randomness) and runs at the new
    length; the run after the change is the same on 1 and 2 ranks."""
    info = corpus(tmp_path, mean_length=30)
    fim = dict(fim_training=True, psm_rate=0.5, spm_rate=0.5, fim_pre=6, fim_mid=7, fim_suf=8)
    old, new = (_config(info, s, shuffle_window=6, **fim) for s in (32, 64))
    states, _ = _saved_at(old, 4)
    steps = []
    for world_size in (1, 2):
        loaders = rank_loaders(new, world_size, batch_size=4 // world_size)
        for loader in loaders:
            loader.load_state_dict(states, allow_changes=["seq_length"])
        steps.append(global_steps(loaders, 5))
    assert steps[0] == steps[1]


def drop_every_third(tokens, document_id):
    return int(document_id) % 3 != 0


def filtered(shard):
    return DocumentFilter(default_stages(shard), drop_every_third, pad=PAD)


def test_a_document_filter_across_the_change(tmp_path):
    """A document filter keeps its counts and its record of split documents: after the
    change it keeps judging pieces (in lines of the new length), its counts go on from the
    saved ones, and the run is the same on 1 and 2 ranks."""
    info = corpus(tmp_path, mean_length=30)
    old, new = (_config(info, s, shuffle_window=6) for s in (32, 64))
    first = build_dataloader(old, stages=filtered)
    take(first, 4)
    states = [roundtrip(first.snapshot())]
    counted = states[0]["shards"][0]["state"]["stages"]  # the filter tops the chain
    steps = []
    for world_size in (1, 2):
        loaders = [
            build_dataloader(
                {**new, "batch_size": 4 // world_size},
                rank=r,
                world_size=world_size,
                stages=filtered,
            )
            for r in range(world_size)
        ]
        for loader in loaders:
            loader.load_state_dict(states, allow_changes=["seq_length"])
        steps.append(global_steps(loaders, 4))
        after = loaders[0].snapshot(settle=True)
        entry = next(e for e in after["shards"] if e["id"] == 0)
        now = entry["state"]["stages"]
        assert now["counts"]["lines"] > counted["counts"]["lines"]
    assert steps[0] == steps[1]


def test_checkpoint_dir_resumes_at_the_new_length(tmp_path):
    """The automatic checkpoint folder: the config's ``allow_changes`` lets the loader
    continue at another seq_length; without it, the refusal names that one field."""
    info = corpus(tmp_path / "data", mean_length=30)
    folder = str(tmp_path / "ckpt")
    old = _config(info, 32, checkpoint_dir=folder, checkpoint_every=3)
    ledger = Ledger(info, _config(info, 64))
    first = build_dataloader(old)
    ledger.add_batches(take(first, 6))
    first.close()
    refused = build_dataloader({**old, "seq_length": 64})
    with pytest.raises(StateMismatchError, match=r"allow_changes=\['seq_length'\]"):
        take(refused, 1)
    new = {**old, "seq_length": 64, "allow_changes": ["seq_length"]}
    loader = build_dataloader(new)
    ledger.add_batches(take(loader, 5))
    assert loader.steps == 11
    final = loader.snapshot(settle=True)
    loader.close()
    ledger.add_state(final, every_stage=True)
    check_exactly_once_per_epoch(ledger, [final], 4)


def test_schedule_in_steps_is_refused_plainly(tmp_path):
    info = corpus(tmp_path)
    schedule = dict(
        weight_schedule=[[0, [1.0, 1.0]], [50, [1.0, 3.0]]],
        schedule_unit="steps",
        global_batch_size=4,
        weights=None,
    )
    states, _ = _saved_at(_config(info, 32, **schedule), 3)
    loader = build_dataloader(_config(info, 64, **schedule))
    with pytest.raises(StateMismatchError, match="start a new run"):
        loader.load_state_dict(states, allow_changes=["seq_length"])


def test_a_dataset_that_starts_rotating_is_refused_plainly(tmp_path):
    """A dataset holding fewer tokens than a line per logical shard at the new length only
    is dealt otherwise there (docs/guide/document-order.md): positions cannot be kept."""
    info = corpus(tmp_path, {"a": 3, "b": 1}, mean_length=30)
    states, _ = _saved_at(_config(info, 32), 3)
    loader = build_dataloader(_config(info, 400))
    with pytest.raises(StateMismatchError, match=r"dataset 'b'.*start a new run"):
        loader.load_state_dict(states, allow_changes=["seq_length"])


def test_a_stage_holding_lines_must_say_how_to_repack_them():
    class Holder(Stage):
        @classmethod
        def held_spans(cls, own):
            return np.asarray(own["lines"], dtype=np.int64).reshape(-1, 5)

    change = LineChange(None, 32, 64)
    assert Holder.relength({"lines": []}, change, {}) == {"lines": []}
    with pytest.raises(StateMismatchError, match="start a new run"):
        Holder.relength({"lines": [0, 0, 1, 0, 5]}, change, {})


def test_end_of_document_token_is_kept_across_the_change(tmp_path):
    """Documents keep their decoration: as many EOS tokens come out as whole documents."""
    info = corpus(tmp_path, mean_length=30)
    old, new = (_config(info, s, "best_fit", shuffle_window=6) for s in (32, 64))
    after, _ = _check_coverage(info, old, new, 4, 6)
    assert sum(int((b["input_ids"] == EOS).sum()) for b in after) > 0


def test_trainer_integration_path_takes_the_config_field(tmp_path):
    """The trainer integrations load the entry they carried (``carried_state``, resumed
    through ``packed_union``) with no argument: the config's ``allow_changes`` is what lets
    the run continue at another seq_length, on another number of ranks too."""
    from fmsdata.integrations.ranks import carried_state, packed_union

    info = corpus(tmp_path, mean_length=30)
    old = _config(info, 32, shuffle_window=6)
    first = build_dataloader(old)
    take(first, 4)
    carried = carried_state(first, 0, 1)
    new = _config(info, 64, shuffle_window=6, allow_changes=["seq_length"])
    steps = []
    for world_size in (1, 2):
        loaders = rank_loaders(new, world_size, batch_size=4 // world_size)
        for loader in loaders:
            loader.load_state_dict(packed_union(carried, 4, "test"))
        steps.append(global_steps(loaders, 4))
    assert steps[0] == steps[1]
    assert all(len(row) == 64 for step in steps[0] for row in step)


def test_checkpoint_functions_take_allow_changes(tmp_path):
    """``fmsdata.checkpoint.save_loader_state`` on 2 ranks, ``load_loader_state`` on 1 at
    another seq_length: the same global steps as the 2-rank run resumed the same way."""
    from fmsdata.checkpoint import load_loader_state, save_loader_state

    info = corpus(tmp_path / "data", mean_length=30)
    old, new = (_config(info, s, shuffle_window=6) for s in (32, 48))
    two = rank_loaders(old, 2, batch_size=2)
    for loader in two:
        take(loader, 3)
        save_loader_state(loader, tmp_path / "ckpt")
    steps = []
    for world_size in (1, 2):
        loaders = rank_loaders(new, world_size, batch_size=4 // world_size)
        for loader in loaders:
            with pytest.raises(StateMismatchError, match=r"allow_changes=\['seq_length'\]"):
                load_loader_state(loader, tmp_path / "ckpt")
            load_loader_state(loader, tmp_path / "ckpt", allow_changes=["seq_length"])
        steps.append(global_steps(loaders, 3))
    assert steps[0] == steps[1]


def test_lines_packed_for_another_length_are_not_blamed_on_the_files(tmp_path):
    """Allowing the derived settings of another change of the lines' length one by one
    (here an EOL token added) lets lines of the old length reach the writer: the error
    says so, and does not say the files changed."""
    info = corpus(tmp_path)
    states, _ = _saved_at(_config(info, 32), 3)
    loader = build_dataloader(_config(info, 32, eol_token=4))
    loader.load_state_dict(states, allow_changes=["capacity", "line_tokens", "eol"])
    with pytest.raises(ConfigError) as refused:
        take(loader, 2)
    message = str(refused.value)
    assert "packed for another line length" in message and "new run" in message
    assert "files changed" not in message
