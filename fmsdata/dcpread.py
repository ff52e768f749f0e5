"""Read entries of a ``torch.distributed.checkpoint`` folder without running its pickle.

A DCP folder's ``.metadata`` is a pickle, and ``FileSystemReader.read_metadata`` /
``dcp.load`` hand it to ``pickle.load``: a crafted file runs any code it names. Here it is
unpickled with an allow-list: only DCP's own metadata classes and the few torch and standard
types they hold (``torch.Size``, dtypes, layouts, paths) can be named, and no persistent ids
are accepted, so a crafted file can only produce an error. The entries themselves are read
from the storage files at the offsets the metadata gives, each with
``torch.load(weights_only=True)`` — again no arbitrary unpickling.
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata

from fmsdata.errors import StateMismatchError

__all__ = ["read_metadata", "read_tensors", "ALLOWED_GLOBALS"]

METADATA_FILE = ".metadata"

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
    path = os.path.join(os.fspath(folder), METADATA_FILE)
    try:
        with open(path, "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
    except OSError as err:
        raise StateMismatchError(f"{path}: cannot read DCP metadata ({err})") from None
    except pickle.UnpicklingError as err:
        raise StateMismatchError(
            f"{path}: refused to read this DCP metadata: {err} "
            "(only DCP's metadata classes are accepted; nothing in the file was run)"
        ) from None
    except Exception as err:  # a malformed stream fails in many ways inside the unpickler
        raise StateMismatchError(
            f"{path}: malformed DCP metadata ({type(err).__name__}: {err})"
        ) from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise StateMismatchError(
            f"{path}: holds a {type(metadata).__name__}, not DCP checkpoint metadata"
        )
    return metadata


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
        chunk = meta.chunks[0]
        info = storage.get(MetadataIndex(key, chunk.offsets))
        out[key] = _read_entry(folder, key, info, tuple(meta.size))
    return out


def _read_entry(folder: str, key: str, info: Any, size: tuple[int, ...]) -> torch.Tensor:
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
    try:
        tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:
        raise StateMismatchError(
            f"{where}: not a tensor saved by DCP ({type(err).__name__}: {err})"
        ) from None
    if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != size:
        raise StateMismatchError(f"{where}: the stored tensor does not have the recorded size")
    return tensor
