"""A plain, code-free file format for loader states.

A state file is a zip archive holding ``state.json`` (the nested structure, with each
numpy array replaced by a reference) and ``.npy`` files. Arrays of one dtype are stored
together, one after the other in a flat ``.npy`` named by the dtype (``u2.npy``), each
referenced as ``{"__array__": "u2", "at": first element, "shape": [...]}`` (plus
``"order": "F"`` for a column-major one): a state holds hundreds of small arrays (a few
per logical shard), and one zip member each would cost more than their data. (A whole
member, ``{"__array__": name}``, is read too.) Arrays are deflated run-length only
(``fmsdata.util.zipwrite``): as small, in half the time. Reading parses JSON and ``.npy``
headers with ``allow_pickle=False``: a state file cannot run code. Writes go to a
temporary file that is renamed into place, so a crash mid-write never leaves a damaged
state under the final name. The path functions here are for files on this machine; a
loader checkpoint on object storage is read and written as bytes
(``fmsdata.checkpoint``).
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from typing import Any, Literal, cast

import numpy as np

from fmsdata.errors import ShardFormatError, StateMismatchError
from fmsdata.handlers.npy_header import npy_from_bytes
from fmsdata.util.urls import local_path
from fmsdata.util.zipwrite import RLE, STRINGS, zip_bytes

__all__ = [
    "save_state",
    "load_state",
    "peek_state",
    "state_to_bytes",
    "state_from_bytes",
    "header_from_bytes",
]

_REMOTE_HINT = "loader checkpoint folders may be URLs (fmsdata.checkpoint)"

_JSON = "state.json"
_ARRAY_KEY = "__array__"
_REF_KEYS = {_ARRAY_KEY, "at", "shape", "order"}
_UNREADABLE = (zipfile.BadZipFile, KeyError, ValueError, EOFError, UnicodeDecodeError)


class _Arrays:
    """The arrays of a state being written, grouped by dtype."""

    def __init__(self) -> None:
        self.groups: dict[str, list[np.ndarray]] = {}
        self.sizes: dict[str, int] = {}

    def add(self, array: np.ndarray) -> dict[str, Any]:
        if array.dtype == object or array.dtype.kind == "V":
            raise TypeError(f"{array.dtype} arrays cannot be saved in a loader state")
        name = array.dtype.str.lstrip("<>|=")
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        # Column-major arrays stay so: columns of similar small integers compress far
        # better than rows that interleave them.
        order: Literal["C", "F"] = "F" if array.ndim > 1 and array.flags.f_contiguous else "C"
        ref: dict[str, Any] = {_ARRAY_KEY: name, "at": self.sizes.get(name, 0)}
        ref.update(shape=list(array.shape), **({"order": "F"} if order == "F" else {}))
        self.groups.setdefault(name, []).append(array.ravel(order=order))
        self.sizes[name] = ref["at"] + array.size
        return ref


def _flatten(value: Any, arrays: _Arrays) -> Any:
    if isinstance(value, np.ndarray):
        return arrays.add(value)
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"state keys must be strings, got {key!r}")
        return {k: _flatten(v, arrays) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_flatten(v, arrays) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot save {type(value).__name__} in a loader state")


def _restore(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(value, dict):
        if _ARRAY_KEY in value and set(value) <= _REF_KEYS:
            return _array(value, arrays)
        return {k: _restore(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v, arrays) for v in value]
    return value


def _array(ref: dict[str, Any], arrays: dict[str, np.ndarray]) -> np.ndarray:
    """The array a reference names (a slice of a dtype's group, or a whole member)."""
    name = ref[_ARRAY_KEY]
    if not isinstance(name, str) or name not in arrays:
        raise StateMismatchError(f"state refers to a missing array {name!r}")
    if set(ref) == {_ARRAY_KEY}:
        return arrays[name]
    group = arrays[name]
    at, shape, order = ref.get("at"), ref.get("shape"), ref.get("order", "C")
    if (
        group.ndim != 1
        or not _is_count(at)
        or not isinstance(shape, list)
        or not all(_is_count(n) for n in shape)
        or order not in ("C", "F")
    ):
        raise StateMismatchError(f"bad array reference {ref!r}")
    at = cast(int, at)  # a count, checked above
    size = int(np.prod(shape, dtype=np.int64))
    if at + size > len(group):
        raise StateMismatchError(f"array reference {ref!r} runs past the {len(group)} values")
    return group[at : at + size].reshape(shape, order=order)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def state_to_bytes(state: Any) -> bytes:
    """Serialize a state (nested dicts, lists, scalars, numpy arrays) to bytes."""
    arrays = _Arrays()
    tree = _flatten(state, arrays)
    members = [(_JSON, json.dumps(tree, separators=(",", ":")).encode("utf-8"), STRINGS)]
    for name, parts in arrays.groups.items():
        data = io.BytesIO()
        np.lib.format.write_array(data, np.concatenate(parts), allow_pickle=False)
        members.append((f"{name}.npy", data.getvalue(), RLE))
    return zip_bytes(members)


def state_from_bytes(data: bytes, source: str = "<bytes>") -> Any:
    """Inverse of ``state_to_bytes``; never unpickles.

    Raises:
        StateMismatchError: The bytes are not a loader state file (names ``source``).
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            tree = json.loads(archive.read(_JSON).decode("utf-8"))
            arrays = {}
            for info in archive.infolist():
                if info.filename.endswith(".npy"):
                    with archive.open(info) as handle:
                        arrays[info.filename[:-4]] = npy_from_bytes(
                            handle.read(), f"{source}:{info.filename}"
                        )
    except (*_UNREADABLE, ShardFormatError) as err:  # ShardFormatError: an array's header
        raise StateMismatchError(f"{source}: not a readable loader state file ({err})") from None
    try:
        return _restore(tree, arrays)
    except StateMismatchError as err:
        raise StateMismatchError(f"{source}: {err}") from None


def save_state(path: str | os.PathLike[str], state: Any) -> None:
    """Write a state file atomically (temporary file, fsync, rename).

    Raises:
        ConfigError: ``path`` is a URL (this writes local files only).
    """
    path = local_path(path, "save_state(path)", _REMOTE_HINT)
    data = state_to_bytes(state)
    partial = f"{path}.tmp"
    with open(partial, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def load_state(path: str | os.PathLike[str]) -> Any:
    """Read a state file written by ``save_state``.

    Raises:
        ConfigError: ``path`` is a URL (this reads local files only).
    """
    path = local_path(path, "load_state(path)", _REMOTE_HINT)
    with open(path, "rb") as handle:
        return state_from_bytes(handle.read(), path)


def peek_state(path: str | os.PathLike[str]) -> Any:
    """The JSON part of a state file, arrays not read (they stay ``{"__array__": name}``):
    the cheap way to see a state's scalar fields, such as the step and world size of a save.

    Raises:
        StateMismatchError: Not a readable state file (names the path).
        OSError: The file cannot be opened (``FileNotFoundError`` when it is gone).
        ConfigError: ``path`` is a URL (this reads local files only).
    """
    path = local_path(path, "peek_state(path)", _REMOTE_HINT)
    with open(path, "rb") as handle:
        return _header(handle, path)


def header_from_bytes(data: bytes, source: str = "<bytes>") -> Any:
    """``peek_state`` of a state file's bytes (``source`` names it in errors)."""
    return _header(io.BytesIO(data), source)


def _header(handle: Any, source: str) -> Any:
    try:
        with zipfile.ZipFile(handle) as archive:
            return json.loads(archive.read(_JSON).decode("utf-8"))
    except _UNREADABLE as err:
        raise StateMismatchError(f"{source}: not a readable loader state file ({err})") from None
