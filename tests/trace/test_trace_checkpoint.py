"""Steps before, at and after a checkpoint, on the world size that saved it and on the
one a resumed run used, each told as delivered; a checkpoint that cannot tell the steps
before it says so."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import base_config, corpus, roundtrip, scratch_dir, take
from tracecheck import assert_step_delivered, rank_batches

from fmsdata import StateMismatchError, build_dataloader
from fmsdata.checkpoint import save_loader_state
from fmsdata.trace import Tracer

SAVED_AT = 5


@pytest.fixture(scope="module")
def info(tmp_path_factory):
    return corpus(tmp_path_factory.mktemp("corpus"))


def saved_run(config, world_size, steps, saved_at, skip=None):
    """Every rank's batches of an unbroken run, and every rank's state after ``saved_at``
    steps (``skip``: ``(at, n)`` skipped by ``loader.skip`` when the run reaches ``at``)."""
    loaders = [build_dataloader(config, rank=r, world_size=world_size) for r in range(world_size)]
    per_rank = []
    states = []
    for loader in loaders:
        batches = []
        iterator = iter(loader)
        while len(batches) < steps:
            if skip and loader.steps == skip[0] and [skip[0], skip[1]] not in loader.skips:
                loader.skip(skip[1])
            batches.append(next(iterator))
            if loader.steps == saved_at:
                states.append(roundtrip(loader.snapshot()))
        per_rank.append(batches)
    return [[b[s] for b in per_rank] for s in range(steps)], states


@pytest.mark.parametrize("workers", [0, 2])
def test_steps_around_a_checkpoint_are_told_as_delivered(info, workers):
    config = base_config(info, num_workers=workers)
    delivered, states = saved_run(config, 2, 10, SAVED_AT)
    tracer = Tracer(config, checkpoint=states)
    assert tracer.checkpoint_step == SAVED_AT
    for trace in tracer.steps(range(1, 11)):
        told = trace.to_plain()
        assert_step_delivered(told, delivered[trace.step - 1], info)
        if trace.step <= SAVED_AT:
            assert "reaches the checkpoint's state" in told["checked"]
        else:
            assert told["from"] == f"the checkpoint at step {SAVED_AT}"


@pytest.mark.parametrize("world_size", [1, 4])
def test_a_run_resumed_on_another_world_size_is_told(info, world_size):
    config = base_config(info)
    _, states = saved_run(config, 2, SAVED_AT, SAVED_AT)
    resumed = []
    for rank in range(world_size):
        loader = build_dataloader(config, rank=rank, world_size=world_size)
        loader.load_state_dict(states)
        resumed.append(take(loader, 6))
    tracer = Tracer(config, checkpoint=states, world_size=world_size)
    for trace in tracer.steps(range(SAVED_AT + 1, SAVED_AT + 7)):
        batches = [resumed[r][trace.step - SAVED_AT - 1] for r in range(world_size)]
        assert_step_delivered(trace.to_plain(), batches, info)


def test_a_checkpoint_folder_is_read(info, tmp_path):
    config = base_config(info)
    loaders = [build_dataloader(config, rank=r, world_size=2) for r in range(2)]
    for loader in loaders:
        take(loader, 3)
    for loader in loaders:
        save_loader_state(loader, tmp_path / "ckpt")
    delivered = rank_batches(config, 2, 5)
    tracer = Tracer(config, checkpoint=tmp_path / "ckpt")
    assert tracer.checkpoint_step == 3
    for trace in tracer.steps([2, 3, 4, 5]):
        assert_step_delivered(trace.to_plain(), delivered[trace.step - 1], info)


def test_a_mix_change_on_resume_is_told_on_both_sides(info):
    config = base_config(info)
    delivered, states = saved_run(config, 2, SAVED_AT, SAVED_AT)
    changed = {**config, "weights": [1.0, 3.0], "allow_mix_change": True}
    resumed = []
    for rank in range(2):
        loader = build_dataloader(changed, rank=rank, world_size=2)
        loader.load_state_dict(states)
        resumed.append(take(loader, 5))
    tracer = Tracer(changed, checkpoint=states)
    for trace in tracer.steps(range(1, SAVED_AT + 6)):
        if trace.step <= SAVED_AT:
            batches = delivered[trace.step - 1]
        else:
            batches = [resumed[r][trace.step - SAVED_AT - 1] for r in range(2)]
        assert_step_delivered(trace.to_plain(), batches, info)


def test_skips_recorded_in_a_checkpoint_are_told(info):
    config = base_config(info)
    delivered, states = saved_run(config, 2, 8, 9, skip=(2, 3))
    tracer = Tracer(config, checkpoint=states)
    assert tracer.checkpoint_step == 9
    traces = {t.step: t for t in tracer.steps(range(1, 12))}
    assert [s for s, t in traces.items() if t.skipped] == [3, 4, 5]
    assert traces[4].to_plain()["skip"] == {"at": 2, "steps": 3}
    told = [s for s in sorted(traces) if not traces[s].skipped]
    for k, step in enumerate(told[:8]):
        assert_step_delivered(traces[step].to_plain(), delivered[k], info)


def test_a_checkpoint_that_cannot_tell_earlier_steps_says_how(info):
    config = base_config(info)
    _, first = saved_run(config, 2, 3, 3)
    changed = {**config, "weights": [1.0, 1.0], "allow_mix_change": True}
    states = []
    for rank in range(2):
        loader = build_dataloader(changed, rank=rank, world_size=2)
        loader.load_state_dict(first)
        take(loader, 3)
        states.append(roundtrip(loader.snapshot()))
    tracer = Tracer(changed, checkpoint=states)
    with pytest.raises(StateMismatchError, match="earlier checkpoint"):
        tracer.step(2)
    # Told from the checkpoint the change was made at, they are.
    assert Tracer(changed, checkpoint=first).step(2).to_plain()["checked"]


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 5),
    shards_batch=st.sampled_from([(4, 4), (4, 2), (6, 3), (8, 4)]),
    before_after=st.sampled_from([(2, 1), (1, 2), (2, 4), (4, 2), (3, 1)]),
    saved_at=st.integers(0, 4),
    extra=st.sampled_from(
        [{}, {"packing": "pad", "pad_token": 5}, {"document_order": "sequential"}]
    ),
)
def test_any_run_resumed_on_any_world_size_is_told(
    seed, shards_batch, before_after, saved_at, extra
):
    """Over seeds, logical shards, batch sizes, the world sizes before and after a
    checkpoint and where it was taken: every step on both sides is told as delivered."""
    shards, batch = shards_batch
    before, after = before_after
    if before > shards or after > shards:
        return
    info = corpus(scratch_dir(), {"a": 2, "b": 2}, docs_per_file=12, mean_length=30)
    config = base_config(info, seed=seed, logical_shards=shards, batch_size=batch, **extra)
    loaders = [build_dataloader(config, rank=r, world_size=before) for r in range(before)]
    first = [take(loader, saved_at) for loader in loaders]
    states = [roundtrip(loader.snapshot()) for loader in loaders]
    resumed = []
    for rank in range(after):
        loader = build_dataloader(config, rank=rank, world_size=after)
        loader.load_state_dict(states)
        resumed.append(take(loader, 4))
    tracer = Tracer(config, checkpoint=states, world_size=after)
    for trace in tracer.steps(range(1, saved_at + 5)):
        if trace.step <= saved_at:
            batches = [first[r][trace.step - 1] for r in range(before)]
        else:
            batches = [resumed[r][trace.step - saved_at - 1] for r in range(after)]
        assert_step_delivered(trace.to_plain(), batches, info)
