"""Read entries of a ``torch.distributed.checkpoint`` folder without running its pickle.

A DCP folder's ``.metadata`` is a pickle, and ``FileSystemReader.read_metadata`` /
``dcp.load`` hand it to ``pickle.load``: a crafted file runs any code it names. Here it is
unpickled with an allow-list: only DCP's own metadata classes and the few torch and standard
types they hold (``torch.Size``, dtypes, layouts, paths) can be named, and no persistent ids
are accepted, so a crafted file can only produce an error. The entries themselves are read
from the storage files at the offsets the metadata gives, each with
``torch.load(weights_only=True)`` — again no arbitrary unpickling.

``SafeFileSystemReader`` puts the same rules under ``dcp.load`` itself, as its
``storage_reader``, so a checkpoint someone handed you can be loaded, model and optimizer
included, without running anything it holds.
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from fmsdata.errors import StateMismatchError
from fmsdata.util.urls import local_path

__all__ = [
    "SafeFileSystemReader",
    "read_metadata",
    "read_tensors",
    "read_objects",
    "ALLOWED_GLOBALS",
]

METADATA_FILE = ".metadata"

# This reader and fmsdata's own loader checkpoints differ: the latter may be URLs.
_LOCAL_ONLY = (
    "this reader reads local folders (fmsdata's own loader checkpoints, save_loader_state, "
    "may be URLs)"
)

# (module, name) pairs a DCP ``.metadata`` written by torch 2.x refers to. Each is a plain
# data class, an enum, or a constructor that only builds a value from plain arguments.
_DCP_CLASSES = {
    "torch.distributed.checkpoint.metadata": (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    ),
    "torch.distributed.checkpoint.filesystem": ("_StorageInfo",),
    # Where torch < 2.2 kept TensorProperties.
    "torch.distributed._shard.sharded_tensor.metadata": (
        "TensorProperties",
        "MEM_FORMAT_ENCODING",
    ),
    "torch": ("Size",),
    "torch.serialization": ("_get_layout",),
    "pathlib": ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"),
    "collections": ("OrderedDict",),
}
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    (module, name) for module, names in _DCP_CLASSES.items() for name in names
)


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only allow-listed globals (and torch dtypes); refuses persistent ids."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return getattr(importlib.import_module(module), name)
        if module == "torch" and isinstance(vars(torch).get(name), torch.dtype):
            return vars(torch)[name]  # dtypes pickle as their name in ``torch``
        raise pickle.UnpicklingError(
            f"it refers to {module}.{name}, which is not part of DCP metadata"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it holds a persistent id, which DCP metadata never does")


def read_metadata(folder: str | os.PathLike[str]) -> Metadata:
    """The ``Metadata`` in ``folder/.metadata``, unpickled through the allow-list.

    Raises:
        StateMismatchError: The file is missing, malformed, or names anything beyond DCP's
            metadata classes (nothing it names outside them is imported or called).
    """
    path = os.path.join(local_path(folder, "read_metadata(folder)", _LOCAL_ONLY), METADATA_FILE)
    return _unpickle_metadata(open, path)


def _unpickle_metadata(open_file: Callable[[str, str], Any], path: str) -> Metadata:
    """The ``Metadata`` in the ``.metadata`` file at ``path`` (opened with ``open_file``),
    through the allow-list."""
    try:
        with open_file(path, "rb") as handle:
            try:
                metadata = _MetadataUnpickler(handle).load()
            except pickle.UnpicklingError as err:
                raise StateMismatchError(
                    f"{path}: refused to read this DCP metadata: {err} "
                    "(only DCP's metadata classes are accepted; nothing in the file was run)"
                ) from None
            except Exception as err:  # a malformed stream fails in many ways in the unpickler
                raise StateMismatchError(
                    f"{path}: malformed DCP metadata ({type(err).__name__}: {err})"
                ) from None
    except OSError as err:
        raise StateMismatchError(f"{path}: cannot read DCP metadata ({err})") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise StateMismatchError(
            f"{path}: holds a {type(metadata).__name__}, not DCP checkpoint metadata"
        )
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """A DCP ``storage_reader`` for checkpoints you did not write: loading runs nothing.

    ``dcp.load(state, checkpoint_id=path)`` reads with ``FileSystemReader``, which unpickles
    ``.metadata`` with plain ``pickle`` (a crafted file runs code) and hands non-tensor
    entries to the planner, whose default ``load_bytes`` uses ``torch.load(weights_only=False)``.
    Pass ``storage_reader=SafeFileSystemReader(path)`` instead: the metadata goes through the
    allow-list of DCP's metadata classes, tensors are read as by torch
    (``weights_only=True``), and each non-tensor entry (optimizer hyperparameters, step
    counters, user extras) must load with ``torch.load(weights_only=True)``; the planner then
    gets that entry re-saved from the checked value, never the file's own bytes. It protects
    the whole load, model and optimizer entries included, whatever planner is used. Types
    beyond ``weights_only``'s defaults are admitted the torch way,
    ``torch.serialization.add_safe_globals``.

    The ``.metadata`` is read when the reader is made and when ``dcp.load`` resets it to
    its ``checkpoint_id``, so a refused one raises ``StateMismatchError`` itself, before any
    load step.

    Raises:
        StateMismatchError: The metadata names anything outside DCP's metadata classes or is
            malformed (from the constructor or ``dcp.load``). A non-tensor entry that is not
            plain ``weights_only`` data is found while ``dcp.load`` reads data, so torch
            reports it inside its ``CheckpointException`` (``failures[rank][0]``). Each
            message names the file (and the entry) and what was refused.
    """

    def __init__(self, path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> None:
        path = local_path(path, "SafeFileSystemReader(path)", _LOCAL_ONLY)
        super().__init__(path, *args, **kwargs)
        self._checked: tuple[str, Metadata] | None = None
        self._check()

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            checkpoint_id = local_path(checkpoint_id, "checkpoint_id", _LOCAL_ONLY)
        super().reset(checkpoint_id)
        self._check()

    def _check(self) -> None:
        """Read the checkpoint's ``.metadata`` now, where a refusal reaches the caller as
        itself: inside ``dcp.load`` torch turns a reader's error into an ``AssertionError``
        in a ``CheckpointException`` and logs tracebacks. ``dcp.load`` constructs nothing
        and calls ``reset(checkpoint_id)`` before its own steps. The metadata read here is
        handed to the next ``read_metadata``, so the file is unpickled once per load. A
        checkpoint without a global ``.metadata`` (per-rank metadata) is checked when read.
        """
        path = os.fspath(self.fs.concat_path(self.path, METADATA_FILE))
        exists = os.path.exists(path)
        self._checked = (path, _unpickle_metadata(self.fs.create_stream, path)) if exists else None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        # Per-rank metadata (``__{rank}.metadata``) is what torch writes without collectives.
        name = METADATA_FILE if rank is None else f"__{rank}{METADATA_FILE}"
        path = os.fspath(self.fs.concat_path(self.path, name))
        checked, self._checked = self._checked, None
        if checked is None or checked[0] != path:
            checked = (path, _unpickle_metadata(self.fs.create_stream, path))
        metadata = checked[1]
        storage_meta = getattr(metadata, "storage_meta", None)
        if storage_meta is None:
            storage_meta = metadata.storage_meta = StorageMeta()
        storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        return super().read_data(plan, _CheckedBytes(planner, self))  # type: ignore[arg-type]


class _CheckedBytes:
    """Stands in for the planner during ``read_data``: every non-tensor entry is loaded
    with ``weights_only=True`` and re-saved before the real planner sees it; everything
    else goes to the planner unchanged."""

    def __init__(self, planner: LoadPlanner, reader: SafeFileSystemReader):
        self._planner = planner
        self._reader = reader

    def __getattr__(self, name: str) -> Any:
        return getattr(self._planner, name)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        info = self._reader.storage_data.get(read_item.storage_index)
        where = os.path.join(os.fspath(self._reader.path), str(getattr(info, "relative_path", "?")))
        try:
            checked = torch.load(value, weights_only=True)
        except Exception as err:
            raise StateMismatchError(
                f"{where}: refused DCP entry {read_item.dest_index.fqn!r}: it is not plain "
                f"data that torch.load(weights_only=True) accepts ({_reason(err)}); nothing "
                "in it was run"
            ) from None
        clean = io.BytesIO()
        torch.save(checked, clean)
        clean.seek(0)
        self._planner.load_bytes(read_item, clean)


def _reason(err: BaseException) -> str:
    """The line of a weights_only refusal that names what was refused; the rest of
    torch's message is a dozen lines of general advice."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    named = [line for line in lines if "GLOBAL" in line or "Unsupported" in line]
    return (named or lines or [type(err).__name__])[0]


def read_tensors(
    folder: str | os.PathLike[str], metadata: Metadata, wanted: Callable[[str], bool]
) -> dict[str, torch.Tensor]:
    """The tensors whose key passes ``wanted``, read from the storage files of ``folder``.

    Only unsharded tensors (one chunk covering the whole tensor, as a loader state entry is)
    saved in DCP's default format are read; anything else is refused with its key.

    Raises:
        StateMismatchError: An entry's storage is missing, outside the folder, cut short,
            transformed (compressed, encrypted) or not a tensor of the recorded size.
    """
    folder = os.fspath(folder)
    storage = metadata.storage_data if isinstance(metadata.storage_data, dict) else {}
    out = {}
    for key, meta in metadata.state_dict_metadata.items():
        if not wanted(key):
            continue
        if not isinstance(meta, TensorStorageMetadata) or len(meta.chunks) != 1:
            raise StateMismatchError(f"{folder}: DCP entry {key!r} is not a single saved tensor")
        info = storage.get(MetadataIndex(key, meta.chunks[0].offsets))
        out[key] = _read_entry(folder, key, info, tuple(meta.size))
    return out


def read_objects(
    folder: str | os.PathLike[str], metadata: Metadata, wanted: Callable[[str], bool]
) -> dict[str, Any]:
    """The non-tensor entries (DCP's bytes entries: strings, bytes, numbers, small dicts)
    whose key passes ``wanted``, each read with ``torch.load(weights_only=True)``.

    Raises:
        StateMismatchError: An entry's storage is missing, outside the folder, cut short,
            transformed, or holds anything ``weights_only`` refuses (nothing is run).
    """
    folder = os.fspath(folder)
    storage = metadata.storage_data if isinstance(metadata.storage_data, dict) else {}
    out = {}
    for key, meta in metadata.state_dict_metadata.items():
        if wanted(key) and isinstance(meta, BytesStorageMetadata):
            data = _entry_bytes(folder, key, storage.get(MetadataIndex(key)))
            try:
                out[key] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            except Exception as err:
                raise StateMismatchError(
                    f"{folder}: DCP entry {key!r} is not plain data that "
                    f"torch.load(weights_only=True) accepts ({_reason(err)}); nothing in it "
                    "was run"
                ) from None
    return out


def _read_entry(folder: str, key: str, info: Any, size: tuple[int, ...]) -> torch.Tensor:
    where = f"{folder}: DCP entry {key!r}"
    data = _entry_bytes(folder, key, info)
    try:
        tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:
        raise StateMismatchError(
            f"{where}: not a tensor saved by DCP ({type(err).__name__}: {err})"
        ) from None
    if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != size:
        raise StateMismatchError(f"{where}: the stored tensor does not have the recorded size")
    return tensor


def _entry_bytes(folder: str, key: str, info: Any) -> bytes:
    """The stored bytes of one entry, at the place ``info`` (its ``_StorageInfo``) gives."""
    where = f"{folder}: DCP entry {key!r}"
    relative = getattr(info, "relative_path", None)
    offset, length = getattr(info, "offset", None), getattr(info, "length", None)
    if not (isinstance(relative, str) and type(offset) is int and type(length) is int):
        raise StateMismatchError(f"{where} has no storage location in the metadata")
    if os.path.basename(relative) != relative or relative in ("", ".", ".."):
        raise StateMismatchError(f"{where} points outside the checkpoint folder: {relative!r}")
    if getattr(info, "transform_descriptors", None):
        raise StateMismatchError(
            f"{where} is stored transformed ({info.transform_descriptors}); not supported here"
        )
    path = os.path.join(folder, relative)
    if offset < 0 or length < 0:
        raise StateMismatchError(f"{where}: negative offset {offset} or length {length}")
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read(length)
    except OSError as err:
        raise StateMismatchError(f"{where}: cannot read {path} ({err})") from None
    if len(data) != length:
        raise StateMismatchError(
            f"{where}: {path} ends {length - len(data)} bytes before the entry does"
        )
    return data
