"""fmsdata's loader state inside a trainer's checkpoint, found and read without running it.

Where each trainer keeps what its integration hands it (every data-parallel rank's state,
``fmsdata.integrations.ranks``), as ``fmsdata state show`` looks for it:

- torchtitan: a DCP folder ``<dump>/checkpoint/step-<N>/``; the entries
  ``dataloader.format``, ``dataloader.fmsdata_meta`` and ``dataloader.fmsdata_shard_*`` are
  DCP bytes entries, read with ``torch.load(weights_only=True)``. A training script that
  puts the loader itself in ``dcp.save`` (``{"dataloader": loader}``) leaves the same keys
  without ``format``, as uint8 tensors (``LoaderState.pack``); both are read.
- OLMo-core: ``<save>/step<N>/train/rank<r>.pt`` (``torch.save`` of the trainer state),
  under ``data_loader``; every rank file carries every rank's state, so one is read.
- Lightning: one ``.ckpt`` file (``torch.save``), under the data module's class name
  (``FmsDataModule``).

A ``torch.save`` file is read by ``fmsdata.state.torchsave_read``: its pickle's globals
become inert placeholders, nothing is imported or called, and tensors are not read. A
DCP folder's ``.metadata`` goes through the allow-list of ``fmsdata.state.dcp_read``. When
no loader state is found, the error says what the file or folder is and what it holds
instead.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

from fmsdata.errors import StateMismatchError
from fmsdata.integrations.ranks import FORMAT, saved_union
from fmsdata.state.format import META_KEY, SHARD_PREFIX

__all__ = [
    "TrainerState",
    "dcp_loader_state",
    "torch_save_loader_state",
    "trainer_checkpoint_state",
]

_FORMAT_KEY = "format"
_FORMAT_FAMILY = FORMAT.split("/")[0] + "/"
# Step folders of the trainers and of examples/train_fsdp.py: step-N (torchtitan), stepN
# (OLMo-core), step_N (DCP folders a training script writes).
_STEP_FOLDER = re.compile(r"^step[-_]?(\d+)$")
_LIGHTNING_STEP = re.compile(r"(?:^|[-_])step=(\d+)")
_OLMO_RANK_FILE = re.compile(r"^rank(\d+)\.pt$")
_SEARCH_DEPTH = 3


@dataclasses.dataclass(frozen=True)
class TrainerState:
    """A loader state found in a checkpoint.

    Attributes:
        where: The file or folder it was read from.
        source: What held it, in words (``Lightning checkpoint entry 'FmsDataModule'``).
        packed: Every saved rank's packed state (``LoaderState.unpack`` reads it).
    """

    where: str
    source: str
    packed: Mapping[str, Any]


def torch_save_loader_state(stream: BinaryIO, where: str) -> TrainerState:
    """The loader state in a ``torch.save`` file (a Lightning ``.ckpt``, an OLMo-core
    ``rank<r>.pt``), found wherever the file keeps it.

    Raises:
        StateMismatchError: The file is not a ``torch.save`` file, holds no fmsdata loader
            state (saying what kind of checkpoint it is and what it holds), holds several,
            or holds a damaged one (naming the entry and the field).
    """
    from fmsdata.state.torchsave_read import read_torch_save

    tree = read_torch_save(stream, where)
    kind = _torch_save_kind(tree)
    found = list(_carried(tree, (), _SEARCH_DEPTH))
    if not found:
        raise StateMismatchError(
            f"{where}: {kind} with no fmsdata loader state in it: {_why(tree)}"
        )
    if len(found) > 1:
        paths = ", ".join(repr(_dotted(path)) for path, _ in found)
        raise StateMismatchError(f"{where}: {kind} with several fmsdata loader states ({paths})")
    path, state = found[0]
    source = f"{kind}, entry {_dotted(path)!r}"
    return TrainerState(where, source, saved_union(state, f"{where}: {source}"))


def dcp_loader_state(folder: str) -> TrainerState:
    """The loader state in a ``torch.distributed.checkpoint`` folder: a trainer
    integration's (bytes entries under a ``format`` key, as torchtitan saves them) or a
    loader saved as a ``Stateful`` (uint8 tensors).

    Raises:
        StateMismatchError: No loader state (naming the folder's top-level entries), several
            (naming their keys), or a damaged one.
    """
    from fmsdata.state.dcp_read import read_metadata, read_objects

    olmo = os.path.isdir(os.path.join(folder, os.pardir, "train"))
    hint = (
        " (an OLMo-core checkpoint keeps the loader state in its step folder's "
        "train/rank<r>.pt: give the step folder)"
        if olmo
        else ""
    )
    try:
        metadata = read_metadata(folder)
    except StateMismatchError as err:
        raise StateMismatchError(f"{err}{hint}") from None
    keys = list(metadata.state_dict_metadata)
    groups: dict[str, set[str]] = {}
    for key in keys:
        prefix, _, leaf = key.rpartition(".")
        groups.setdefault(prefix, set()).add(leaf)
    prefixes = [p for p, leaves in groups.items() if META_KEY in leaves]
    if not prefixes:
        raise StateMismatchError(
            f"{folder}: a torch.distributed.checkpoint holding no fmsdata loader state "
            f"(no entry ends in {META_KEY!r}); its entries: {_top_level(keys)}{hint}"
        )
    if len(prefixes) > 1:
        raise StateMismatchError(
            f"{folder}: a torch.distributed.checkpoint holding several fmsdata loader "
            f"states (under {', '.join(repr(p) for p in sorted(prefixes))})"
        )
    prefix = prefixes[0]

    def ours(key: str) -> bool:
        group, _, leaf = key.rpartition(".")
        return group == prefix and (
            leaf in (META_KEY, _FORMAT_KEY) or leaf.startswith(SHARD_PREFIX)
        )

    entries = {**_read_tensors(folder, metadata, ours), **read_objects(folder, metadata, ours)}
    cut = len(prefix) + 1 if prefix else 0
    state = {key[cut:]: value for key, value in entries.items()}
    source = (
        f"torch.distributed.checkpoint, entry {prefix!r}"
        if prefix
        else "torch.distributed.checkpoint"
    )
    if _FORMAT_KEY in state:
        return TrainerState(folder, source, saved_union(state, f"{folder}: {source}"))
    return TrainerState(folder, source, state)


def _read_tensors(folder: str, metadata: Any, wanted: Callable[[str], bool]) -> dict[str, Any]:
    """``read_tensors`` of the tensor entries among those ``wanted`` picks."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from fmsdata.state.dcp_read import read_tensors

    tensors = {
        key
        for key, meta in metadata.state_dict_metadata.items()
        if wanted(key) and isinstance(meta, TensorStorageMetadata)
    }
    return read_tensors(folder, metadata, tensors.__contains__) if tensors else {}


def trainer_checkpoint_state(path: str) -> TrainerState | None:
    """The loader state of the trainer checkpoint at the local ``path``, whichever layout it
    has (see the module docstring); a folder of step folders is read at its newest step.
    None when ``path`` is no trainer checkpoint layout at all.

    Raises:
        StateMismatchError: It is a trainer checkpoint, but holds no readable loader state
            (saying why).
    """
    if os.path.isfile(path):
        with open(path, "rb") as stream:
            from fmsdata.state.torchsave_read import is_torch_save

            return torch_save_loader_state(stream, path) if is_torch_save(stream) else None
    if not os.path.isdir(path):
        return None
    names = os.listdir(path)
    if ".metadata" in names:
        return dcp_loader_state(path)
    rank_file = _olmo_rank_file(path, names)
    if rank_file is not None:
        return _from_file(rank_file)
    ckpt = _lightning_file(path, names)
    if ckpt is not None:
        return _from_file(ckpt)
    if "checkpoint" in names and os.path.isdir(os.path.join(path, "checkpoint")):
        return trainer_checkpoint_state(os.path.join(path, "checkpoint"))  # torchtitan's dump
    steps = sorted(
        (int(match.group(1)), name)
        for name in names
        if (match := _STEP_FOLDER.match(name)) and os.path.isdir(os.path.join(path, name))
    )
    for _, name in reversed(steps):
        found = trainer_checkpoint_state(os.path.join(path, name))
        if found is not None:
            return found
    return None


def _from_file(path: str) -> TrainerState:
    with open(path, "rb") as stream:
        return torch_save_loader_state(stream, path)


def _olmo_rank_file(path: str, names: list[str]) -> str | None:
    """The lowest-ranked ``rank<r>.pt`` of an OLMo-core step folder (or its ``train/``)."""
    folder = path
    if "train" in names and os.path.isdir(os.path.join(path, "train")):
        folder = os.path.join(path, "train")
        names = os.listdir(folder)
    ranks = sorted((int(m.group(1)), n) for n in names if (m := _OLMO_RANK_FILE.match(n)))
    return os.path.join(folder, ranks[0][1]) if ranks else None


def _lightning_file(path: str, names: list[str]) -> str | None:
    """The ``.ckpt`` file of a Lightning checkpoint folder: the one with the largest
    ``step=N`` in its name, or the only one.

    Raises:
        StateMismatchError: Several ``.ckpt`` files and no step in some of their names.
    """
    ckpts = sorted(
        n for n in names if n.endswith(".ckpt") and os.path.isfile(os.path.join(path, n))
    )
    if not ckpts:
        return None
    if len(ckpts) == 1:
        return os.path.join(path, ckpts[0])
    steps = [(_LIGHTNING_STEP.search(n), n) for n in ckpts]
    if any(match is None for match, _ in steps):
        raise StateMismatchError(
            f"{path}: holds several Lightning checkpoints ({', '.join(ckpts)}), not all "
            "named by step: give the file to read"
        )
    return os.path.join(path, max((int(m.group(1)), n) for m, n in steps if m)[1])


def _torch_save_kind(tree: Any) -> str:
    if isinstance(tree, Mapping):
        if "pytorch-lightning_version" in tree:
            return "Lightning checkpoint"
        if "data_loader" in tree and "global_step" in tree:
            return "OLMo-core trainer state"
    return "torch.save file"


def _why(tree: Any) -> str:
    """What a checkpoint holds in place of a loader state, in words."""
    if not isinstance(tree, Mapping):
        return f"it holds a {type(tree).__name__}, not a dict of entries"
    keys = ", ".join(repr(str(k)) for k in list(tree)[:20])
    if "pytorch-lightning_version" in tree:
        return (
            f"its entries are {keys}: fmsdata's FmsDataModule saves every rank's state "
            "under its class name, so the run used another data module, or saved before "
            "its loader was built"
        )
    loader = tree.get("data_loader") if "global_step" in tree else None
    if isinstance(loader, Mapping):
        inner = ", ".join(repr(str(k)) for k in list(loader)[:10])
        return (
            f"its 'data_loader' entry holds {inner or 'nothing'}: not a loader built by "
            "fmsdata.integrations.olmo_core"
        )
    return f"its entries are {keys}"


def _carried(
    value: Any, path: tuple[str, ...], depth: int
) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every mapping under ``value`` (at most ``depth`` levels down) whose ``format`` names
    an fmsdata rank-states entry, with its key path."""
    if not isinstance(value, Mapping):
        return
    found = value.get(_FORMAT_KEY)
    if isinstance(found, str) and found.startswith(_FORMAT_FAMILY):
        yield path, value
        return
    if depth == 0:
        return
    for key, item in value.items():
        yield from _carried(item, (*path, str(key)), depth - 1)


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(path) or "(top level)"


def _top_level(keys: list[str]) -> str:
    tops = sorted({key.split(".", 1)[0] for key in keys})
    shown = ", ".join(repr(t) for t in tops[:20])
    return shown + (f" and {len(tops) - 20} more" if len(tops) > 20 else "")
