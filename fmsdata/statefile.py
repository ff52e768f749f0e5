"""A plain, code-free file format for loader states.

A state file is a zip archive holding ``state.json`` (the nested structure, with each
numpy array replaced by ``{"__array__": name}``) and one ``.npy`` file per array. Reading
it parses JSON and ``.npy`` headers with ``allow_pickle=False``: a state file cannot run
code. Writes go to a temporary file that is renamed into place, so a crash mid-write never
leaves a damaged state under the final name.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from typing import Any

import numpy as np

from fmsdata.errors import StateMismatchError

__all__ = ["save_state", "load_state", "peek_state", "state_to_bytes", "state_from_bytes"]

_JSON = "state.json"
_ARRAY_KEY = "__array__"


def _flatten(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError("object arrays cannot be saved in a loader state")
        name = f"a{len(arrays)}"
        arrays[name] = value
        return {_ARRAY_KEY: name}
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
        if set(value) == {_ARRAY_KEY}:
            return arrays[value[_ARRAY_KEY]]
        return {k: _restore(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v, arrays) for v in value]
    return value


def state_to_bytes(state: Any) -> bytes:
    """Serialize a state (nested dicts, lists, scalars, numpy arrays) to bytes."""
    arrays: dict[str, np.ndarray] = {}
    tree = _flatten(state, arrays)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        archive.writestr(_entry(_JSON), json.dumps(tree, separators=(",", ":")), compresslevel=1)
        for name, array in arrays.items():
            data = io.BytesIO()
            # Column-major arrays stay so (``.npy`` records the order): columns of similar
            # small integers compress far better than rows that interleave them.
            if not array.flags.f_contiguous:
                array = np.ascontiguousarray(array)
            np.lib.format.write_array(data, array, allow_pickle=False)
            archive.writestr(_entry(f"{name}.npy"), data.getvalue(), compresslevel=1)
    return buffer.getvalue()


def _entry(name: str) -> zipfile.ZipInfo:
    """A member with a fixed timestamp: the same state always gives the same bytes."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


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
                        arrays[info.filename[:-4]] = np.lib.format.read_array(
                            io.BytesIO(handle.read()), allow_pickle=False
                        )
    except (zipfile.BadZipFile, KeyError, ValueError, EOFError, UnicodeDecodeError) as err:
        raise StateMismatchError(f"{source}: not a readable loader state file ({err})") from None
    try:
        return _restore(tree, arrays)
    except KeyError as err:
        raise StateMismatchError(f"{source}: state refers to a missing array {err}") from None


def save_state(path: str | os.PathLike[str], state: Any) -> None:
    """Write a state file atomically (temporary file, fsync, rename)."""
    path = os.fspath(path)
    data = state_to_bytes(state)
    partial = f"{path}.tmp"
    with open(partial, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def load_state(path: str | os.PathLike[str]) -> Any:
    """Read a state file written by ``save_state``."""
    path = os.fspath(path)
    with open(path, "rb") as handle:
        return state_from_bytes(handle.read(), path)


def peek_state(path: str | os.PathLike[str]) -> Any:
    """The JSON part of a state file, arrays not read (they stay ``{"__array__": name}``):
    the cheap way to see a state's scalar fields, such as the step and world size of a save.

    Raises:
        StateMismatchError: Not a readable state file (names the path).
        OSError: The file cannot be opened (``FileNotFoundError`` when it is gone).
    """
    path = os.fspath(path)
    with open(path, "rb") as handle:
        try:
            with zipfile.ZipFile(handle) as archive:
                return json.loads(archive.read(_JSON).decode("utf-8"))
        except (zipfile.BadZipFile, KeyError, ValueError, EOFError, UnicodeDecodeError) as err:
            raise StateMismatchError(f"{path}: not a readable loader state file ({err})") from None
