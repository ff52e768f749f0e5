"""Reading a saved state strictly: every value checked where it is read, named by its path.

A loader state is user input (a file someone hands over, a checkpoint cut short, a dict
edited by hand). Whoever reads a part of it checks that part here: the type, the range,
the keys. A failure is a ``StateMismatchError`` whose message starts with the path of the
value inside the state (``shards[3].state.stages.source.carry[1]``) and shows the value,
so nothing damaged gets as far as running. Checks are plain ``if``s, never ``assert``
(``python -O`` removes those).

Paths compose: a reader checks its part with paths relative to it (``"carry[1]"``), and
whoever handed it that part prefixes the key it came from (``within("source", ...)``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from fmsdata.errors import StateMismatchError

__all__ = [
    "join",
    "within",
    "fail",
    "need_count",
    "need_int",
    "need_mapping",
    "need_list",
    "need_keys",
    "plain_problem",
]

_PATH = re.compile(r"^[\w\[\].,\-']+(?=: )")


def join(prefix: str, key: str | int) -> str:
    """``prefix`` extended by a key (``a.b``) or a list index (``a[3]``)."""
    step = f"[{key}]" if isinstance(key, int) else str(key)
    if not prefix:
        return step
    return f"{prefix}{step}" if step.startswith("[") else f"{prefix}.{step}"


def fail(path: str, message: str) -> StateMismatchError:
    """The error for the value at ``path``: ``"<path>: <message>"``."""
    return StateMismatchError(f"{path}: {message}" if path else message)


@contextlib.contextmanager
def within(key: str | int) -> Iterator[None]:
    """Prefix ``key`` to the path of any StateMismatchError raised inside (a message that
    starts with no path gets ``key`` as its path)."""
    try:
        yield
    except StateMismatchError as err:
        message = str(err)
        match = _PATH.match(message)
        if match:
            raise StateMismatchError(
                join(join("", key), match.group(0)) + message[match.end() :]
            ) from None
        raise fail(join("", key), message) from None


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def need_int(value: Any, path: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int (bools and floats refused), within ``[low, high]`` when given."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise fail(path, f"expected an integer, got {type(value).__name__} {_show(value)}")
    number = int(value)
    if low is not None and number < low:
        raise fail(path, f"must be at least {low}, got {number}")
    if high is not None and number > high:
        raise fail(path, f"must be at most {high}, got {number}")
    return number


def need_count(value: Any, path: str, high: int | None = None) -> int:
    """A non-negative integer (a position, a count)."""
    return need_int(value, path, 0, high)


def need_mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise fail(path, f"expected a mapping, got {type(value).__name__} {_show(value)}")
    return value


def need_keys(
    value: Any, path: str, keys: Sequence[str] | set[str], owner: str = ""
) -> Mapping[str, Any]:
    """A mapping with exactly ``keys`` (names the missing and the unexpected ones).

    The one key check of every state reader (stages, shard states, packed entries):
    ``owner`` names whose state it is (``"packer state"``), for the message, when the
    path alone would not say (a user's stage, a shard)."""
    mapping = need_mapping(value, path)
    missing = sorted(set(keys) - set(mapping))
    extra = sorted(set(mapping) - set(keys), key=str)
    if missing or extra:
        parts = [f"missing {missing}" if missing else "", f"unexpected {extra}" if extra else ""]
        said = f"keys {', '.join(p for p in parts if p)} (expected {sorted(keys)})"
        raise fail(path, f"{owner}: {said}" if owner else said)
    return mapping


def need_list(value: Any, path: str, length: int | None = None) -> Sequence[Any]:
    """A list or tuple (a string is not one), of ``length`` items when given."""
    if not isinstance(value, (list, tuple)):
        raise fail(path, f"expected a list, got {type(value).__name__} {_show(value)}")
    if length is not None and len(value) != length:
        raise fail(path, f"expected {length} items, got {len(value)}: {_show(value)}")
    return value


def plain_problem(value: Any, path: str = "") -> str | None:
    """Where ``value`` is not plain state data (G6: dicts with string keys, lists, tuples,
    ints, floats, strings, bools, None, numpy numbers and numpy arrays not of Python
    objects), as ``"path: what"``; None where it all is. What a loader state file can hold
    (``fmsdata.state.file``), and what travels from a DataLoader worker as it is."""
    if value is None or isinstance(value, (bool, int, float, str, np.integer, np.floating)):
        return None
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "OV":
            return None
        return f"{path or 'state'}: a numpy array of dtype {value.dtype}"
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path or 'state'}: key {key!r} is not a string"
            problem = plain_problem(item, join(path, key))
            if problem is not None:
                return problem
        return None
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = plain_problem(item, join(path, i))
            if problem is not None:
                return problem
        return None
    return f"{path or 'state'}: {type(value).__name__} {value!r:.60}"
