"""S4: loader checkpoints next to a model checkpoint (files per rank, DCP, automatic)."""

import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from support import assert_same_batches, base_config, corpus, global_steps, rank_loaders, take

from fmsdata import build_dataloader
from fmsdata.checkpoint import (
    LoadPlanner,
    latest_checkpoint,
    load_loader_state,
    rank_file,
    save_loader_state,
)
from fmsdata.errors import StateMismatchError


def listing(folder):
    return sorted(
        (name, os.stat(os.path.join(folder, name)).st_mtime_ns) for name in os.listdir(folder)
    )


@pytest.fixture
def two_rank_checkpoint(tmp_path):
    info = corpus(tmp_path / "data")
    config = base_config(info, logical_shards=8, batch_size=4)
    loaders = rank_loaders(config, 2)
    head = global_steps(loaders, 6)
    for loader in loaders:
        save_loader_state(loader, tmp_path / "ckpt")
    return info, config, head, tmp_path / "ckpt"


@pytest.mark.parametrize("new_world", [2, 1, 4])
def test_files_resume_on_any_world_size(two_rank_checkpoint, new_world):
    info, config, head, ckpt = two_rank_checkpoint
    reference = global_steps(rank_loaders(config, 2), 16)
    assert head == reference[:6]
    loaders = rank_loaders(config, new_world, batch_size=8 // new_world)
    for loader in loaders:
        load_loader_state(loader, ckpt)
    assert global_steps(loaders, 10) == reference[6:]


def test_rank_files_are_plain_state_files(two_rank_checkpoint):
    from fmsdata.state.file import load_state

    _, config, _, ckpt = two_rank_checkpoint
    assert sorted(os.listdir(ckpt)) == [
        "loader_rank_00000.fms",
        "loader_rank_00000.world_2.step_6.done",
        "loader_rank_00001.fms",
        "loader_rank_00001.world_2.step_6.done",
    ]
    state = load_state(rank_file(ckpt, 1))
    assert state["rank"] == 1 and state["world_size"] == 2 and state["steps"] == 6
    assert state["fingerprint"]["logical_shards"] == 8 and state["fingerprint"]["data"]
    assert [e["id"] for e in state["shards"]] == [4, 5, 6, 7]


def test_missing_rank_file_is_named_and_nothing_changes(two_rank_checkpoint):
    _, config, _, ckpt = two_rank_checkpoint
    os.remove(rank_file(ckpt, 1))
    before = listing(ckpt)
    loader = build_dataloader(config, rank=0, world_size=1)
    with pytest.raises(StateMismatchError, match="missing: loader_rank_00001.fms"):
        load_loader_state(loader, ckpt)
    assert listing(ckpt) == before


def test_truncated_rank_file_is_named(two_rank_checkpoint):
    _, config, _, ckpt = two_rank_checkpoint
    path = rank_file(ckpt, 0)
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) // 2)
    before = listing(ckpt)
    with pytest.raises(StateMismatchError, match="loader_rank_00000.fms"):
        load_loader_state(build_dataloader(config, rank=0, world_size=2), ckpt)
    assert listing(ckpt) == before


def test_state_of_another_dataset_is_refused(two_rank_checkpoint, tmp_path):
    _, config, _, ckpt = two_rank_checkpoint
    other = corpus(tmp_path / "other", docs_per_file=30)
    loader = build_dataloader({**config, "data_path": other.root}, rank=0, world_size=2)
    with pytest.raises(StateMismatchError, match="data="):
        load_loader_state(loader, ckpt)


def test_rank_files_from_different_saves_are_refused(two_rank_checkpoint):
    _, config, _, ckpt = two_rank_checkpoint
    loader = build_dataloader(config, rank=1, world_size=2)
    take(loader, 9)
    save_loader_state(loader, ckpt)  # rank 1 moved on, rank 0 did not
    with pytest.raises(StateMismatchError, match="different steps"):
        load_loader_state(build_dataloader(config, rank=0, world_size=1), ckpt)


def test_crash_during_save_leaves_the_previous_checkpoint(two_rank_checkpoint, monkeypatch):
    _, config, _, ckpt = two_rank_checkpoint
    loader = build_dataloader(config, rank=0, world_size=2)
    take(loader, 3)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        save_loader_state(loader, ckpt)
    monkeypatch.undo()
    fresh = build_dataloader(config, rank=0, world_size=2)
    load_loader_state(fresh, ckpt)  # still the complete step-6 checkpoint
    assert fresh.steps == 6


def test_dcp_save_and_load(tmp_path):
    info = corpus(tmp_path / "data")
    config = base_config(info, num_workers=1)
    reference = take(build_dataloader(config), 20)
    loader = build_dataloader(config)
    take(loader, 8)
    model = torch.nn.Linear(3, 2)
    dcp.save(
        {"dataloader": loader, "model": model.state_dict()}, checkpoint_id=str(tmp_path / "dcp")
    )
    fresh = build_dataloader(config)
    target = {"dataloader": fresh, "model": torch.nn.Linear(3, 2).state_dict()}
    dcp.load(target, checkpoint_id=str(tmp_path / "dcp"), planner=LoadPlanner())
    assert torch.equal(target["model"]["weight"], model.weight)
    assert_same_batches(reference[8:], take(fresh, 12))


def test_dcp_load_without_the_planner_fails_loudly(tmp_path):
    """Without ``LoadPlanner`` the entries cannot be sized: the load fails, and the loader
    it was meant for is left as it was (step 0, the run's first batches), never half-loaded."""
    info = corpus(tmp_path / "data")
    config = base_config(info)
    reference = take(build_dataloader(config), 4)
    loader = build_dataloader(config)
    take(loader, 2)
    dcp.save({"dataloader": loader}, checkpoint_id=str(tmp_path / "dcp"))
    target = build_dataloader(config)
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException):  # a BaseException subclass
        dcp.load({"dataloader": target}, checkpoint_id=str(tmp_path / "dcp"))
    assert target.steps == 0
    assert_same_batches(reference, take(target, 4))
    # The same checkpoint loads with the planner: the failure was the missing planner's.
    dcp.load({"dataloader": target}, checkpoint_id=str(tmp_path / "dcp"), planner=LoadPlanner())
    assert target.steps == 2


def test_automatic_checkpoints_resume_from_the_newest(tmp_path):
    info = corpus(tmp_path / "data")
    config = base_config(
        info, num_workers=1, checkpoint_dir=str(tmp_path / "auto"), checkpoint_every=5
    )
    reference = take(
        build_dataloader({**config, "checkpoint_every": 0, "checkpoint_dir": None}), 40
    )
    loader = build_dataloader(config)
    assert_same_batches(reference[:23], take(loader, 23))
    loader.checkpointer.wait()
    assert sorted(os.listdir(tmp_path / "auto")) == ["step_000000015", "step_000000020"]
    # An interrupted save leaves an incomplete folder, which is passed over.
    os.makedirs(tmp_path / "auto" / "step_000000025")
    assert latest_checkpoint(tmp_path / "auto").endswith("step_000000020")
    resumed = build_dataloader(config)
    assert resumed.steps == 20
    assert_same_batches(reference[20:40], take(resumed, 20))


def test_a_folder_saved_before_markers_existed_still_loads(two_rank_checkpoint, tmp_path):
    """No ``.done`` markers: the files' own records decide, as before (W reads)."""
    _, config, _, ckpt = two_rank_checkpoint
    reference = global_steps(rank_loaders(config, 2), 10)
    for name in os.listdir(ckpt):
        if name.endswith(".done"):
            os.remove(ckpt / name)
    auto = tmp_path / "auto"
    auto.mkdir()
    os.rename(ckpt, auto / "step_000000006")
    assert latest_checkpoint(auto) == str(auto / "step_000000006")
    loaders = rank_loaders(config, 1, batch_size=8)
    load_loader_state(loaders[0], auto / "step_000000006")
    assert global_steps(loaders, 4) == reference[6:10]


def test_a_state_file_written_again_after_its_marker_is_refused(two_rank_checkpoint):
    from fmsdata.state.file import save_state

    _, config, _, ckpt = two_rank_checkpoint
    later = build_dataloader(config, rank=0, world_size=2)
    take(later, 9)
    save_state(rank_file(ckpt, 0), later.snapshot())  # the file, not its marker
    fresh = build_dataloader(config, rank=0, world_size=2)
    with pytest.raises(StateMismatchError, match="records step 9 of 2 but its save was marked"):
        load_loader_state(fresh, ckpt)
    assert fresh.steps == 0


def test_rank_files_left_from_another_save_are_not_read(two_rank_checkpoint, caplog):
    """A 2-rank save complete, plus rank 2's file of a 3-rank save cut short."""
    _, config, _, ckpt = two_rank_checkpoint
    other = build_dataloader({**config, "logical_shards": 6}, rank=2, world_size=3)
    take(other, 2)
    save_loader_state(other, ckpt)
    fresh = build_dataloader({**config, "batch_size": 8}, rank=0, world_size=1)
    load_loader_state(fresh, ckpt)
    assert fresh.steps == 6
    assert "[2] are not part of its complete save (step 6 of 2)" in caplog.text


def test_checkpoints_on_an_fsspec_filesystem(tmp_path):
    """The remote code path (listing, one write per file, removal without rename) on
    fsspec's in-memory filesystem: automatic checkpoints of 2 ranks, pruned, resumed on 1."""
    import uuid

    import fsspec

    info = corpus(tmp_path / "data")
    root = f"memory://ckpt-{uuid.uuid4().hex}/auto"
    config = base_config(info, logical_shards=8, batch_size=4)
    reference = global_steps(rank_loaders(config, 2), 12)
    auto = {**config, "checkpoint_dir": root, "checkpoint_every": 2, "checkpoint_keep": 1}
    rank0, rank1 = rank_loaders(auto, 2)
    # Rank 1 first, its last save finished: rank 0, which prunes, then finds each of its
    # saves complete at once.
    second = global_steps([rank1], 7)
    rank1.close()
    first = global_steps([rank0], 7)
    rank0.close()
    assert [sorted(a + b) for a, b in zip(first, second)] == reference[:7]
    assert latest_checkpoint(root) == f"{root}/step_000000006"
    assert fsspec.filesystem("memory").ls(root, detail=False) == [f"{root[8:]}/step_000000006"]
    resumed = rank_loaders({**auto, "checkpoint_every": 0}, 1, batch_size=8)
    assert resumed[0].steps == 6
    assert global_steps(resumed, 6) == reference[6:12]
    fsspec.filesystem("memory").rm(root, recursive=True)
