"""DCP checkpoint folders are read without running the ``.metadata`` pickle (issue 18), by
``state show`` and by ``dcp.load`` through ``SafeFileSystemReader`` (issue 22)."""

import io
import os
import pickle
import struct

import pytest
import torch
import torch.distributed.checkpoint as dcp
from support import assert_same_batches, base_config, corpus, take
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from fmsdata import build_dataloader
from fmsdata.checkpoint import LoadPlanner, SafeFileSystemReader
from fmsdata.cli.main import main
from fmsdata.errors import StateMismatchError
from fmsdata.state.dcp_read import read_metadata, read_tensors


@pytest.fixture
def dcp_folder(tmp_path):
    info = corpus(tmp_path / "data")
    loader = build_dataloader(base_config(info))
    take(loader, 5)
    folder = tmp_path / "dcp"
    model = torch.nn.Linear(3, 2)
    extra = {"step": 5, "name": "run"}
    dcp.save(
        {"dataloader": loader, "model": model.state_dict(), "extra": extra}, checkpoint_id=folder
    )
    return loader, folder


def _global(module: str, name: str, protocol: int) -> bytes:
    """Pickle opcodes pushing ``module.name`` (GLOBAL for protocol 0-3, STACK_GLOBAL for 4)."""
    if protocol < 4:
        return b"c" + module.encode() + b"\n" + name.encode() + b"\n"
    return (
        b"".join(b"\x8c" + bytes([len(text.encode())]) + text.encode() for text in (module, name))
        + b"\x93"
    )


def _payload(module: str, name: str, arg: str, protocol: int = 4) -> bytes:
    """A pickle calling ``module.name(arg)``: what a crafted ``.metadata`` would hold."""
    data = arg.encode()
    call = _global(module, name, protocol) + b"X" + struct.pack("<I", len(data)) + data
    return b"\x80" + bytes([max(protocol, 2)]) + call + b"\x85R."  # TUPLE1 REDUCE STOP


def test_a_loader_saved_with_dcp_is_read_exactly(dcp_folder):
    loader, folder = dcp_folder
    metadata = read_metadata(folder)
    entries = read_tensors(folder, metadata, lambda key: key.startswith("dataloader."))
    expected = loader.state_dict()
    assert {key.removeprefix("dataloader.") for key in entries} == set(expected)
    for key, value in entries.items():
        assert torch.equal(value, expected[key.removeprefix("dataloader.")])
    model = read_tensors(folder, metadata, lambda key: key == "model.weight")
    assert model["model.weight"].shape == (2, 3)


def test_state_show_reads_a_dcp_folder(dcp_folder, capsys):
    _, folder = dcp_folder
    assert main(["state", "show", str(folder)]) == 0
    assert "saved by 1 rank(s) at step 5, 4 logical shards" in capsys.readouterr().out


def _with_planner_data(folder, planner_data):
    """Rewrite a real ``.metadata`` with ``planner_data`` replaced (pickled by ``pickle``)."""
    path = folder / ".metadata"
    with open(path, "rb") as handle:
        metadata = pickle.load(handle)  # our own file, written by dcp.save above
    metadata.planner_data = planner_data
    path.write_bytes(pickle.dumps(metadata))


class _Reduce:
    """Pickles as a call of ``func(*args)``: the attack a crafted metadata makes."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def test_crafted_metadata_does_not_run(dcp_folder, tmp_path, capsys):
    _, folder = dcp_folder
    marker = tmp_path / "marker"
    _with_planner_data(folder, _Reduce(os.system, f"touch {marker}"))
    assert main(["state", "show", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "StateMismatchError" in err and ".metadata" in err
    assert "os" in err and "system" in err and "not part of DCP metadata" in err
    assert not marker.exists()
    # What torch's own reader does with the same file (this is why fmsdata does not use it).
    dcp.FileSystemReader(str(folder)).read_metadata()
    assert marker.exists()


ATTACKS = [
    ("os", "system"),
    ("posix", "system"),
    ("subprocess", "getoutput"),
    ("builtins", "exec"),
    ("builtins", "eval"),
    ("builtins", "getattr"),
    ("builtins", "__import__"),
    ("builtins", "open"),
    ("shutil", "rmtree"),
    ("torch", "load"),
    ("torch.serialization", "load"),
    ("pathlib", "Path.write_text"),  # a dotted name off an allowed class
    ("torch.distributed.checkpoint.metadata", "os.system"),  # through an allowed module
    ("torch.distributed.checkpoint.metadata", "Metadata.__init__.__globals__"),
    ("torch", "Size.__class__"),
    ("torch", "_C"),
    ("io", "open"),
]


@pytest.mark.parametrize("protocol", [0, 4])
@pytest.mark.parametrize(("module", "name"), ATTACKS)
def test_every_global_outside_dcp_metadata_is_refused(tmp_path, module, name, protocol):
    folder = tmp_path / "dcp"
    folder.mkdir()
    marker = tmp_path / "marker"
    (folder / ".metadata").write_bytes(_payload(module, name, str(marker), protocol))
    with pytest.raises(StateMismatchError, match=r"\.metadata: refused .* not part of DCP"):
        read_metadata(folder)
    assert not marker.exists()


def test_a_real_attack_payload_is_what_the_refusal_stops(tmp_path):
    """The crafted bytes are live: plain pickle runs them (so the test above means something)."""
    marker = tmp_path / "marker"
    pickle.loads(_payload("builtins", "exec", f"open({str(marker)!r}, 'w').close()"))
    assert marker.exists()


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x80\x04",
        b"P0\n.",  # a persistent id
        pickle.dumps([1, 2, 3]),  # not metadata
        pickle.dumps({"state_dict_metadata": {}}),
        b"not a pickle at all",
    ],
)
def test_malformed_metadata_is_a_state_error(tmp_path, data):
    folder = tmp_path / "dcp"
    folder.mkdir()
    (folder / ".metadata").write_bytes(data)
    with pytest.raises(StateMismatchError, match=r"\.metadata"):
        read_metadata(folder)


def test_truncated_metadata_is_a_state_error(dcp_folder):
    _, folder = dcp_folder
    path = folder / ".metadata"
    data = path.read_bytes()
    for cut in (1, len(data) // 3, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(StateMismatchError, match=r"\.metadata"):
            read_metadata(folder)


@pytest.mark.parametrize("relative", ["../outside", "/etc/passwd", "sub/file", ".."])
def test_storage_outside_the_folder_is_refused(dcp_folder, relative):
    _, folder = dcp_folder
    metadata = read_metadata(folder)
    for info in metadata.storage_data.values():
        info.relative_path = relative
    with pytest.raises(StateMismatchError, match="outside the checkpoint folder"):
        read_tensors(folder, metadata, lambda key: key.startswith("dataloader."))


def test_cut_storage_file_is_named(dcp_folder):
    _, folder = dcp_folder
    (storage,) = [p for p in folder.iterdir() if p.suffix == ".distcp"]
    storage.write_bytes(storage.read_bytes()[:100])
    with pytest.raises(StateMismatchError, match="distcp ends .* before the entry"):
        read_tensors(folder, read_metadata(folder), lambda key: key.startswith("dataloader."))


def test_storage_entry_that_is_a_crafted_pickle_is_refused(dcp_folder, tmp_path):
    """The storage bytes go through ``torch.load(weights_only=True)``, never plain pickle."""
    _, folder = dcp_folder
    marker = tmp_path / "marker"
    buffer = io.BytesIO()
    torch.save(_Reduce(os.system, f"touch {marker}"), buffer)
    metadata = read_metadata(folder)
    evil = folder / "evil.distcp"
    evil.write_bytes(buffer.getvalue())
    for info in metadata.storage_data.values():
        info.relative_path, info.offset, info.length = "evil.distcp", 0, len(buffer.getvalue())
    with pytest.raises(StateMismatchError, match="not a tensor saved by DCP"):
        read_tensors(folder, metadata, lambda key: key.startswith("dataloader."))
    assert not marker.exists()


# ``SafeFileSystemReader``: the same rules under ``dcp.load`` itself (issue 22).


def _train(model, optimizer, batches):
    """A few optimizer steps on ``batches`` (so the optimizer holds state to resume)."""
    for batch in batches:
        optimizer.zero_grad()
        model(batch["input_ids"][:, :4].float()).pow(2).mean().backward()
        optimizer.step()


def _run(info):
    loader = build_dataloader(base_config(info))
    model = torch.nn.Linear(4, 1)
    return loader, model, torch.optim.AdamW(model.parameters(), lr=0.01)


def _safe_load(folder, loader, model, optimizer, extra=None):
    """The README's load: ``dcp.load`` with ``SafeFileSystemReader`` and ``LoadPlanner``."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "dataloader": loader, **(extra or {})}
    dcp.load(
        state,
        checkpoint_id=str(folder),
        storage_reader=SafeFileSystemReader(str(folder)),
        planner=LoadPlanner(),
    )
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    return state


def test_safe_reader_resumes_model_optimizer_and_loader_exactly(tmp_path):
    info = corpus(tmp_path / "data")
    torch.manual_seed(0)
    loader, model, optimizer = _run(info)
    _train(model, optimizer, take(loader, 3))
    model_sd, optim_sd = get_state_dict(model, optimizer)
    extra = {"step": 3, "name": "run", "betas": (0.9, 0.95)}
    folder = tmp_path / "dcp"
    dcp.save(
        {"model": model_sd, "optim": optim_sd, "dataloader": loader, "extra": extra},
        checkpoint_id=str(folder),
    )
    expected = take(loader, 4)
    _train(model, optimizer, expected)

    resumed, model2, optimizer2 = _run(info)
    state = _safe_load(folder, resumed, model2, optimizer2, {"extra": {k: None for k in extra}})
    assert state["extra"] == extra
    assert optimizer2.state_dict()["state"][0]["step"] == 3
    following = take(resumed, 4)
    assert_same_batches(expected, following)
    _train(model2, optimizer2, following)
    for mine, theirs in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(mine, theirs)


def _nested_global(folder, marker):
    """``os.system`` named as a dotted attribute of an allowed module (STACK_GLOBAL)."""
    payload = _payload("torch.distributed.checkpoint.metadata", "os.system", f"touch {marker}")
    (folder / ".metadata").write_bytes(payload)


def _inside_real_metadata(folder, marker):
    """A real metadata whose storage record of one entry holds ``os.system(...)``."""
    path = folder / ".metadata"
    with open(path, "rb") as handle:
        metadata = pickle.load(handle)  # our own file, written by dcp.save
    info = next(iter(metadata.storage_data.values()))
    info.relative_path = _Reduce(os.system, f"touch {marker}")
    path.write_bytes(pickle.dumps(metadata))


def _touch_code(marker):
    return f"open({str(marker)!r}, 'w').close()"


CRAFTED = {
    "os.system via __reduce__": lambda folder, marker: _with_planner_data(
        folder, _Reduce(os.system, f"touch {marker}")
    ),
    "builtins call": lambda folder, marker: (folder / ".metadata").write_bytes(
        _payload("builtins", "exec", _touch_code(marker))
    ),
    "nested global through an allowed module": _nested_global,
    "call nested in a real metadata": _inside_real_metadata,
}


@pytest.mark.parametrize("craft", CRAFTED.values(), ids=CRAFTED.keys())
def test_safe_reader_refuses_crafted_metadata_and_runs_nothing(dcp_folder, tmp_path, craft):
    _, folder = dcp_folder
    marker = tmp_path / "marker"
    craft(folder, marker)
    loader, model, optimizer = _run(corpus(tmp_path / "data2"))
    refused = r"\.metadata: refused .*nothing in the file was run"
    with pytest.raises(StateMismatchError, match=refused):
        _safe_load(folder, loader, model, optimizer)
    assert not marker.exists()
    # The payload is live: torch's own reader runs it.
    try:
        dcp.FileSystemReader(str(folder)).read_metadata()
    except Exception:
        pass
    assert marker.exists()


def test_safe_reader_checks_the_checkpoint_it_is_reset_to(dcp_folder, tmp_path):
    _, folder = dcp_folder
    reader = SafeFileSystemReader(str(folder))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / ".metadata").write_bytes(_payload("os", "system", "true"))
    with pytest.raises(StateMismatchError, match=r"bad/\.metadata: refused .*os\.system"):
        reader.reset(str(bad))


def test_safe_reader_refuses_a_crafted_non_tensor_entry(tmp_path):
    """Non-tensor entries are ``torch.save`` bytes the default planner loads with
    ``weights_only=False``; the safe reader checks them with ``weights_only=True`` first."""
    info = corpus(tmp_path / "data")
    marker = tmp_path / "marker"
    loader, model, optimizer = _run(info)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    folder = tmp_path / "dcp"
    evil = {"note": _Reduce(os.system, f"touch {marker}")}
    dcp.save(
        {"model": model_sd, "optim": optim_sd, "dataloader": loader, "extra": evil},
        checkpoint_id=str(folder),
    )
    with pytest.raises(CheckpointException) as caught:
        _safe_load(folder, *_run(info), {"extra": {"note": None}})
    (error, _), *_ = caught.value.failures.values()
    assert isinstance(error, StateMismatchError)
    assert "refused DCP entry 'extra.note'" in str(error) and "posix.system" in str(error)
    assert not marker.exists()
    # The entry is live: the default reader hands it to torch.load(weights_only=False).
    dcp.load({"extra": {"note": None}}, checkpoint_id=str(folder))
    assert marker.exists()


def test_state_show_reads_the_newest_dcp_step_of_a_training_checkpoint_folder(tmp_path, capsys):
    """``examples/train_fsdp.py`` writes ``CKPT/step_NNNNNN/`` DCP folders and ``latest``."""
    info = corpus(tmp_path / "data")
    loader = build_dataloader(base_config(info))
    ckpt = tmp_path / "ckpt"
    for step in (3, 10):
        take(loader, step - loader.steps)
        dcp.save({"dataloader": loader}, checkpoint_id=str(ckpt / f"step_{step:06d}"))
    (ckpt / "latest").write_text("10")
    (ckpt / "step_000099").mkdir()  # a save that never wrote its metadata
    assert main(["state", "show", str(ckpt)]) == 0
    out = capsys.readouterr().out
    assert "step_000010" in out and "at step 10," in out
