"""Automatic checkpoints over several ranks: complete saves only, never lost, never racing."""

import logging
import os
import shutil
import threading

import pytest
from support import assert_same_batches, base_config, corpus, global_steps, rank_loaders, take

from fmsdata import build_dataloader
from fmsdata.checkpoint import latest_checkpoint, load_loader_state, save_loader_state
from fmsdata.errors import CheckpointWarning, RemoteIOError, StateMismatchError
from fmsdata.remote.folder import Folder
from fmsdata.state import checkpoint as ckpt
from fmsdata.state.checkpointsave import complete_save


def auto_config(info, root, every=1, keep=1, **overrides):
    return base_config(
        info,
        logical_shards=4,
        checkpoint_dir=str(root),
        checkpoint_every=every,
        checkpoint_keep=keep,
        **overrides,
    )


def lockstep(loaders, n_steps):
    """Step every rank once per global step, rank by rank (as a real job interleaves)."""
    iterators = [iter(loader) for loader in loaders]
    for _ in range(n_steps):
        for iterator in iterators:
            next(iterator)


@pytest.fixture
def watched(monkeypatch):
    """Record every moment a file-system change under the root leaves no complete checkpoint
    newer than or equal to the newest one before it (a checkpoint lost)."""
    state = {"root": None, "violations": [], "lock": threading.Lock()}

    def check(name, real):
        def run(path, *args, **kwargs):
            root = state["root"]
            inside = root is not None and os.fspath(path).startswith(root)
            before = latest_checkpoint(root) if inside else None
            result = real(path, *args, **kwargs)
            if inside and before is not None:
                after = latest_checkpoint(root)
                if after is None or after < before:
                    with state["lock"]:
                        state["violations"].append((name, os.fspath(path), before, after))
            return result

        return run

    monkeypatch.setattr(os, "remove", check("remove", os.remove))
    monkeypatch.setattr(os, "rename", check("rename", os.rename))
    monkeypatch.setattr(shutil, "rmtree", check("rmtree", shutil.rmtree))
    return state


@pytest.mark.parametrize("keep", [1, 2])
@pytest.mark.parametrize("order", ["lockstep", "rank 0 first"])
def test_two_ranks_always_have_a_complete_checkpoint(tmp_path, watched, keep, order):
    info = corpus(tmp_path / "data")
    root = tmp_path / "auto"
    watched["root"] = str(root)
    config = auto_config(info, root, every=1, keep=keep)
    reference = global_steps(
        rank_loaders({**config, "checkpoint_dir": None, "checkpoint_every": 0}, 2), 14
    )
    loaders = rank_loaders(config, 2)
    if order == "lockstep":
        lockstep(loaders, 8)
    else:
        global_steps(loaders, 8)
    for loader in loaders:
        loader.close()
    assert watched["violations"] == []
    assert latest_checkpoint(root) == str(root / "step_000000008")
    assert os.listdir(root)  # pruning keeps the newest complete save
    watched["root"] = None
    for world in (2, 1):  # resume from the folder (without saving more into it)
        resumed = rank_loaders({**config, "checkpoint_every": 0}, world, batch_size=8 // world)
        assert [loader.steps for loader in resumed] == [8] * world
        assert global_steps(resumed, 6) == reference[8:14]


def test_only_rank_0_removes_folders(tmp_path):
    """Rank 1 alone (rank 0 stalled) never deletes: its folders are what rank 0 still needs."""
    info = corpus(tmp_path / "data")
    root = tmp_path / "auto"
    (rank1,) = [build_dataloader(auto_config(info, root, keep=1), rank=1, world_size=2)]
    take(rank1, 5)
    rank1.close()
    assert ckpt.step_folders(root) == [f"step_{k:09d}" for k in range(1, 6)]
    assert latest_checkpoint(root) is None


def test_pruning_leaves_the_newest_complete_save_and_saves_in_flight(tmp_path):
    info = corpus(tmp_path / "data")
    root = tmp_path / "auto"
    config = auto_config(info, root, every=2, keep=1)
    rank0, rank1 = rank_loaders(config, 2)
    take(rank1, 4)  # rank 1 saved steps 2 and 4
    rank1.close()
    take(rank0, 6)  # rank 0 saved 2, 4 (complete) and 6 (rank 1 not there yet)
    rank0.close()
    assert ckpt.step_folders(root) == ["step_000000004", "step_000000006"]
    assert latest_checkpoint(root) == str(root / "step_000000004")


def test_listing_tolerates_folders_removed_meanwhile(tmp_path, monkeypatch):
    info = corpus(tmp_path / "data")
    root = tmp_path / "auto"
    loaders = rank_loaders(auto_config(info, root, every=2, keep=0), 2)
    lockstep(loaders, 4)
    for loader in loaders:
        loader.close()
    real = Folder.names

    def pruned_meanwhile(folder):  # another rank removes the folder between the two listings
        if folder.location.endswith("step_000000004"):
            shutil.rmtree(folder.location)
        return real(folder)

    monkeypatch.setattr(Folder, "names", pruned_meanwhile)
    assert latest_checkpoint(root) == str(root / "step_000000002")


def test_a_folder_mixing_two_runs_is_not_complete(tmp_path):
    """Rank 0's file from a 2-rank save and rank 1's from a 3-rank save of the same step."""
    info = corpus(tmp_path / "data")
    config = base_config(info, logical_shards=6, batch_size=2)
    root = tmp_path / "auto"
    folder = root / "step_000000003"
    two, three = rank_loaders(config, 2), rank_loaders(config, 3)
    for loader in (two[0], three[1]):
        take(loader, 3)
        save_loader_state(loader, folder)
    assert latest_checkpoint(root) is None
    with pytest.raises(StateMismatchError, match="different steps or world sizes"):
        load_loader_state(build_dataloader(config, rank=0, world_size=2), folder)


@pytest.mark.parametrize("loading_rank", [0, 1])
def test_a_rank_file_left_from_an_earlier_step_is_refused_on_the_same_world_size(
    tmp_path, loading_rank
):
    """Rank 0 saved step 6, rank 1 stopped at step 3: no rank may resume from that."""
    info = corpus(tmp_path / "data")
    config = base_config(info, logical_shards=4)
    rank0, rank1 = rank_loaders(config, 2)
    take(rank0, 3)
    take(rank1, 3)
    save_loader_state(rank0, tmp_path / "ckpt")
    save_loader_state(rank1, tmp_path / "ckpt")
    take(rank0, 3)
    save_loader_state(rank0, tmp_path / "ckpt")
    fresh = build_dataloader(config, rank=loading_rank, world_size=2)
    with pytest.raises(StateMismatchError, match="rank 0: step 6 of 2, rank 1: step 3 of 2"):
        load_loader_state(fresh, tmp_path / "ckpt")
    assert fresh.steps == 0


def test_no_complete_folder_is_a_warning(tmp_path, caplog):
    info = corpus(tmp_path / "data")
    root = tmp_path / "auto"
    config = auto_config(info, root, every=2)
    rank1 = build_dataloader(config, rank=1, world_size=2)
    take(rank1, 2)
    rank1.close()
    with caplog.at_level(logging.WARNING, logger="fmsdata"):
        loader = build_dataloader(config, rank=0, world_size=2)
    assert loader.steps == 0
    assert "none is complete" in caplog.text and str(root) in caplog.text


def test_an_automatic_resume_says_what_it_resumed_from(tmp_path, caplog):
    info = corpus(tmp_path / "data")
    root = tmp_path / "auto"
    config = auto_config(info, root, every=2)
    loader = build_dataloader(config)
    take(loader, 4)
    loader.close()
    with caplog.at_level(logging.INFO, logger="fmsdata"):
        resumed = build_dataloader(config)
        assert resumed.steps == 4  # its first use loads the newest checkpoint
    assert f"resumed the loader from {latest_checkpoint(root)}, at step 4" in caplog.text


@pytest.mark.parametrize("removed", ["step folder", "checkpoint root"])
def test_a_save_whose_folder_is_removed_meanwhile_warns_and_the_run_goes_on(
    tmp_path, monkeypatch, removed
):
    """The folder of the save in flight (or the whole checkpoint root) is removed after
    the state file is written, before its marker: the run goes on with a
    ``CheckpointWarning`` naming the folder, that save is never read, and the next save
    is complete and resumes where an unbroken run is."""
    info = corpus(tmp_path / "data")
    root = tmp_path / "auto"
    config = auto_config(info, root, every=2, keep=0)
    unbroken = take(build_dataloader({**config, "checkpoint_dir": None, "checkpoint_every": 0}), 10)
    real = Folder.write

    def removed_meanwhile(folder, name, data):
        if name.endswith(".done") and folder.location.endswith("step_000000004"):
            shutil.rmtree(root / "step_000000004" if removed == "step folder" else root)
        return real(folder, name, data)

    monkeypatch.setattr(Folder, "write", removed_meanwhile)
    loader = build_dataloader(config)
    with pytest.warns(CheckpointWarning, match=r"auto/step_000000004 was removed while"):
        batches = take(loader, 6)
    loader.close()
    assert_same_batches(unbroken[:6], batches)
    assert latest_checkpoint(root) == str(root / "step_000000006")
    assert complete_save(Folder(root / "step_000000004")) is None
    resumed = build_dataloader(config)
    assert_same_batches(unbroken[6:], take(resumed, 4))


def test_a_save_that_fails_otherwise_still_raises(tmp_path, monkeypatch):
    """Only a folder removed meanwhile is a warning: a save the store refuses is an error."""
    info = corpus(tmp_path / "data")
    root = tmp_path / "auto"

    def refused(folder, name, data):
        raise RemoteIOError(f"write {folder.join(name)} failed: AccessDenied")

    monkeypatch.setattr(Folder, "write", refused)
    loader = build_dataloader(auto_config(info, root, every=2))
    with pytest.raises(RemoteIOError, match="AccessDenied"):
        take(loader, 4)
