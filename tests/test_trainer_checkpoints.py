"""``fmsdata state show`` on trainers' checkpoints (issue 43): the loader state is found
where each trainer keeps it, read without running anything the checkpoint names, and when
it cannot be read the error says why.

These files are written here the way each trainer writes them (``torch.save`` of its dict,
``dcp.save`` of its states), without the trainers; ``tests/integrations/test_trainers.py``
(``-m trainers``) reads the checkpoints the real trainers write. The reference is the
loader's own state, summarized in this process."""

import json
import os
import pickle
import zipfile

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from support import base_config, corpus, take

from fmsdata import build_dataloader
from fmsdata.cli.main import main
from fmsdata.cli.state import find_states, summarize
from fmsdata.errors import StateMismatchError
from fmsdata.integrations.ranks import FORMAT, carried_state
from fmsdata.state.torchsave_read import Opaque, is_torch_save, read_torch_save


class _Reduce:
    """Pickles as a call of ``func(*args)``: what a crafted checkpoint holds."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


class _Carried:
    """A DCP ``Stateful`` returning what a trainer integration hands torchtitan."""

    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.state = state


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A loader 5 steps in, its summary and the state an integration carries for it."""
    info = corpus(tmp_path_factory.mktemp("trainer-ckpt") / "data")
    loader = build_dataloader(base_config(info))
    take(loader, 5)
    reference = summarize([loader.snapshot()])
    return reference, carried_state(loader, 0, 1)


def shown(path, capsys):
    assert main(["state", "show", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def same_counts(summary, reference):
    for key in ("steps", "world_size", "lines", "logical_shards", "datasets", "shards"):
        assert summary[key] == reference[key], key


def error_of(path, capsys):
    assert main(["state", "show", str(path)]) == 2
    return capsys.readouterr().err


def test_a_lightning_ckpt_is_read_and_what_it_names_is_not_run(saved, tmp_path, capsys):
    reference, carried = saved
    marker = tmp_path / "marker"
    checkpoint = {
        "epoch": 0,
        "global_step": 5,
        "pytorch-lightning_version": "2.6.6",
        "state_dict": {"head.weight": torch.ones(2, 3)},
        "hyper_parameters": {"hook": _Reduce(os.system, f"touch {marker}")},
        "FmsDataModule": carried,
    }
    path = tmp_path / "step=5.ckpt"
    torch.save(checkpoint, path)
    summary = shown(path, capsys)
    same_counts(summary, reference)
    assert summary["source"] == "Lightning checkpoint, entry 'FmsDataModule'"
    assert not marker.exists()
    with open(path, "rb") as stream:
        assert is_torch_save(stream)
        tree = read_torch_save(stream, str(path))
    hook = tree["hyper_parameters"]["hook"]
    assert isinstance(hook, Opaque) and hook.global_name in ("posix.system", "nt.system")
    assert hook.args == (f"touch {marker}",)
    assert isinstance(tree["state_dict"]["head.weight"], Opaque)  # tensors are not read
    assert not marker.exists()
    # A folder of Lightning checkpoints: the one with the largest step.
    torch.save({**checkpoint, "FmsDataModule": {"format": FORMAT}}, tmp_path / "step=3.ckpt")
    assert shown(tmp_path, capsys)["path"] == str(path)


class Unlisted:
    """An object no ``weights_only`` allow-list admits (a trainer's own class)."""


def test_an_olmo_core_save_folder_is_read_at_its_newest_step(saved, tmp_path, capsys):
    """``step<N>/train/rank<r>.pt`` holds numpy's random state (and here an object of a
    class of its own), which ``torch.load(weights_only=True)`` refuses: the loader state is
    read anyway. (numpy's state alone is admitted once a process has added numpy's
    classes to torch's safe globals, as some libraries do: the class keeps the refusal.)"""
    reference, carried = saved
    rng = {
        "numpy": np.random.default_rng(0).bit_generator.state,
        "legacy": np.random.get_state(),
        "own": Unlisted(),
    }
    for step in (0, 5):
        train = tmp_path / "save" / f"step{step}" / "train"
        train.mkdir(parents=True)
        state = {"global_step": step, "data_loader": carried, "rng": rng, "world_size": 1}
        for rank in (0, 1):
            torch.save(state, train / f"rank{rank}.pt")
    (tmp_path / "save" / "step5" / "model_and_optim").mkdir()
    # Importing megatron.core (tests/formats.py does, earlier in a full run) makes numpy
    # arrays safe for every later torch.load: the premise holds only where none did.
    if not any(getattr(g, "__name__", "") == "_reconstruct" for g in _safe_globals()):
        with pytest.raises(pickle.UnpicklingError):
            torch.load(tmp_path / "save" / "step5" / "train" / "rank0.pt", weights_only=True)
    summary = shown(tmp_path / "save", capsys)
    same_counts(summary, reference)
    assert summary["path"] == str(tmp_path / "save" / "step5" / "train" / "rank0.pt")
    assert summary["source"] == "OLMo-core trainer state, entry 'data_loader'"
    for given in ("step5", "step5/train", "step5/train/rank1.pt"):
        same_counts(shown(tmp_path / "save" / given, capsys), reference)


def test_a_torchtitan_dcp_folder_with_bytes_entries_is_read(saved, tmp_path, capsys):
    """torchtitan's checkpointer saves the integration's dict under ``dataloader`` as DCP
    bytes entries (``dump/checkpoint/step-N``)."""
    reference, carried = saved
    folder = tmp_path / "dump" / "checkpoint" / "step-5"
    model = torch.nn.Linear(3, 2)
    dcp.save({"dataloader": _Carried(carried), "model": model.state_dict()}, checkpoint_id=folder)
    for given in (tmp_path / "dump", tmp_path / "dump" / "checkpoint", folder):
        summary = shown(given, capsys)
        same_counts(summary, reference)
        assert summary["path"] == str(folder)
        assert summary["source"] == "torch.distributed.checkpoint, entry 'dataloader'"


def test_checkpoints_without_a_loader_state_say_what_they_hold(saved, tmp_path, capsys):
    _, carried = saved
    lightning = tmp_path / "other.ckpt"
    torch.save({"pytorch-lightning_version": "2.6.6", "state_dict": {}, "MyData": {}}, lightning)
    err = error_of(lightning, capsys)
    assert "Lightning checkpoint with no fmsdata loader state in it" in err
    assert "'MyData'" in err and "FmsDataModule" in err
    olmo = tmp_path / "rank0.pt"
    torch.save({"global_step": 3, "data_loader": {"batches_processed": 3}}, olmo)
    err = error_of(olmo, capsys)
    assert "OLMo-core trainer state with no fmsdata loader state" in err
    assert "'batches_processed'" in err and "fmsdata.integrations.olmo_core" in err
    titan = tmp_path / "titan"
    dcp.save({"dataloader": {"dp_rank_0": b"x", "world_size": 1}}, checkpoint_id=titan)
    err = error_of(titan, capsys)
    assert "holding no fmsdata loader state" in err and "'dataloader'" in err
    several = tmp_path / "several"
    several.mkdir()
    for name in ("last.ckpt", "best.ckpt"):
        torch.save({"pytorch-lightning_version": "2.6.6", "FmsDataModule": carried}, several / name)
    err = error_of(several, capsys)
    assert "best.ckpt, last.ckpt" in err and "give the file" in err


def test_a_damaged_carried_state_is_named(saved, tmp_path, capsys):
    _, carried = saved
    missing = {key: value for key, value in carried.items() if not key.endswith("00001")}
    path = tmp_path / "step=5.ckpt"
    torch.save({"pytorch-lightning_version": "2.6.6", "FmsDataModule": missing}, path)
    err = error_of(path, capsys)
    assert "entry 'FmsDataModule'" in err and "fmsdata_shard_00001" in err
    newer = {**carried, "format": "fmsdata-rank-states/9"}
    torch.save({"pytorch-lightning_version": "2.6.6", "FmsDataModule": newer}, path)
    err = error_of(path, capsys)
    assert "'fmsdata-rank-states/9'" in err and "newer fmsdata" in err


def test_what_is_not_a_readable_torch_save_file_is_refused_by_name(tmp_path):
    legacy = tmp_path / "legacy.pt"
    torch.save({"a": 1}, legacy, _use_new_zipfile_serialization=False)
    with open(legacy, "rb") as stream:
        assert not is_torch_save(stream)
        with pytest.raises(StateMismatchError, match="not a torch.save file"):
            read_torch_save(stream, str(legacy))
    # The extension registry would reach objects without find_class: refused.
    extension = tmp_path / "ext.pt"
    with zipfile.ZipFile(extension, "w") as archive:
        archive.writestr("ext/data.pkl", b"\x80\x02\x82\x01.")  # PROTO 2, EXT1 1, STOP
    with open(extension, "rb") as stream, pytest.raises(StateMismatchError, match="extension"):
        read_torch_save(stream, str(extension))
    # find_states falls back to fmsdata's own state file for any other file.
    other = tmp_path / "other.bin"
    other.write_bytes(b"not a state")
    with pytest.raises(StateMismatchError, match="not a readable loader state file"):
        find_states(str(other))


def _safe_globals():
    """What ``torch.serialization.add_safe_globals`` registered so far in this process."""
    return [g[0] if isinstance(g, tuple) else g for g in torch.serialization.get_safe_globals()]
