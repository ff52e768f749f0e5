"""How config values are read: the coercions and checks every section shares.

A reader takes the field's name and the value as given (from YAML, a CLI override, a dict
or Python) and returns the normalized value, or raises ``ConfigError`` naming the field
and quoting the value. A section names each field's reader (``fmsdata.config.section``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fmsdata.errors import ConfigError
from fmsdata.util.textcorpus import TOKENIZER_HINT
from fmsdata.util.urls import local_path, location

__all__ = [
    "split_csv",
    "to_number",
    "reader",
    "number",
    "positive_int",
    "non_negative_int",
    "optional_token",
    "optional_path",
    "non_empty",
    "optional_name",
    "flag",
    "one_of",
    "weight_list",
    "as_plain",
    "set_field",
    "Reader",
]

Reader = Callable[[str, Any], Any]


def set_field(obj: Any, name: str, value: Any) -> None:
    """Store a normalized value on a frozen section (only while it is built)."""
    object.__setattr__(obj, name, value)


def split_csv(field: str, value: Any) -> tuple[str, ...] | None:
    """Accept ``"a,b"``, ``["a", "b"]`` or None; return a tuple of stripped strings."""
    if value is None:
        return None
    if isinstance(value, str):
        return tuple(item for item in (item.strip() for item in value.split(",")) if item)
    if isinstance(value, (list, tuple)):
        return tuple(str(item).strip() for item in value)
    raise ConfigError(f"{field} must be a comma string or a list, got {value!r}")


def to_number(field: str, value: Any, kind: type) -> Any:
    """``value`` as an ``int`` or ``float`` (numeric strings accepted, bools refused)."""
    expected = "an integer" if kind is int else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{field} must be {expected}, got {value!r}")
    try:
        number = kind(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int("inf")
        raise ConfigError(f"{field} must be {expected}, got {value!r}") from None
    if kind is int and isinstance(value, float) and value != number:
        raise ConfigError(f"{field} must be an integer, got {value!r}")
    return number


def reader(
    what: str,
    ok: Callable[[Any], bool],
    convert: Reader | None = None,
    *,
    optional: bool = False,
) -> Reader:
    """A reader of the values for which ``ok`` holds (after ``convert``), or None too
    where ``optional``; ``what`` says which values in the error."""

    def read(field: str, value: Any) -> Any:
        if value is None and optional:
            return None
        result = convert(field, value) if convert else value
        if not ok(result):
            raise ConfigError(f"{field} must be {what}, got {value!r}")
        return result

    return read


def number(kind: type, what: str, ok: Callable[[Any], bool], *, optional: bool = False) -> Reader:
    """A reader of ``kind`` (``int`` or ``float``) values for which ``ok`` holds."""
    return reader(what, ok, lambda field, value: to_number(field, value, kind), optional=optional)


def one_of(allowed: Sequence[Any], what: str = "") -> Reader:
    """A reader of values in ``allowed`` (a ``Literal``'s arguments)."""
    return reader(what or f"one of {tuple(allowed)}", lambda value: value in allowed)


def non_empty(what: str, *, optional: bool = False) -> Reader:
    """A reader of non-empty strings (a column, a format, a profile name)."""
    return reader(what, lambda value: isinstance(value, str) and bool(value), optional=optional)


positive_int = number(int, "a positive integer", lambda n: n > 0)
non_negative_int = number(int, "a non-negative integer", lambda n: n >= 0)
optional_token = number(int, "a non-negative token id or None", lambda n: n >= 0, optional=True)
optional_name = non_empty("a non-empty string or None", optional=True)
# Only a real ``bool``: ``"yes"`` or 1 is a mistake to name.
flag = reader("true or false", lambda value: isinstance(value, bool))


# Every field that holds a path, and where it may be (``fmsdata.util.urls``): "read" and
# "write", a local path or a URL of any fsspec filesystem (read from, or written to);
# "local", a path on this machine (a URL is refused by name, never made a local folder).
PATH_FIELDS = {
    "data_path": "read",
    "checkpoint_dir": "write",
    "tokenizer": "local",
    "cache_dir": "local",
}
_LOCAL_HINTS = {
    "tokenizer": TOKENIZER_HINT,
    "cache_dir": "it holds local copies of remote files; give a local folder",
}


def optional_path(field: str, value: Any) -> str | None:
    """A path field (``PATH_FIELDS``): None, or a non-empty ``str`` / ``os.PathLike`` (as
    ``str``) that is a URL only where the field may be one."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise ConfigError(f"{field} must be a path (a non-empty string) or None, got {value!r}")
    text = str(os.fspath(value))
    kind = PATH_FIELDS[field]
    if kind == "local":
        return local_path(text, field, _LOCAL_HINTS.get(field, ""))
    return location(text, field, write=kind == "write")


def weight_list(
    field: str, values: Sequence[Any], datasets: tuple[str, ...] | None, *, weights: bool = True
) -> tuple[float, ...]:
    """One number per dataset, non-negative and finite; ``weights`` (one positive) need
    ``datasets``, other lists are matched to them only where they are named."""
    numbers = tuple(to_number(field, w, float) for w in values)
    if any(not (0 <= w < float("inf")) for w in numbers) or not (
        any(w > 0 for w in numbers) or not weights
    ):
        one = " with one positive" if weights else ""
        raise ConfigError(f"{field} must be non-negative and finite{one}, got {list(values)!r}")
    if datasets is None and weights:
        raise ConfigError(f"{field} needs datasets: name the folders the weights belong to")
    if datasets is not None and len(numbers) != len(datasets):
        raise ConfigError(
            f"{field} has {len(numbers)} entries but datasets has {len(datasets)}: "
            f"{list(numbers)!r} for {list(datasets)!r}"
        )
    return numbers


def as_plain(value: Any) -> Any:
    """``value`` with every tuple made a list and every mapping a dict, nested, as it
    comes back from JSON: how config values and saved state fields are compared."""
    if isinstance(value, (list, tuple)):
        return [as_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: as_plain(v) for k, v in value.items()}
    return value
