"""Shard-format handlers and the registry that picks one by ``file_type``.

Users add a format by subclassing ``FileHandler`` and calling ``register_handler``.
"""

from __future__ import annotations

import inspect
from typing import Any

from fmsdata.errors import ConfigError
from fmsdata.handlers.arrow import ArrowDocHandler
from fmsdata.handlers.base import FileHandler

__all__ = ["FileHandler", "ArrowDocHandler", "register_handler", "make_handler", "handler_names"]

_REGISTRY: dict[str, type[FileHandler]] = {}


def register_handler(cls: type[FileHandler], name: str | None = None) -> type[FileHandler]:
    """Make ``cls`` selectable as ``file_type=name`` (default ``cls.name``); also a decorator."""
    key = name or cls.name
    if not key:
        raise ConfigError(f"handler {cls.__name__} has no name; set the class attribute 'name'")
    _REGISTRY[key] = cls
    return cls


def handler_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def make_handler(file_type: str, **options: Any) -> FileHandler:
    """Instantiate the handler registered as ``file_type`` with the options it accepts.

    Options a handler's constructor does not take are ignored, so one config can carry
    the options of several formats.
    """
    try:
        cls = _REGISTRY[file_type]
    except KeyError:
        raise ConfigError(
            f"file_type {file_type!r} is not a known format; known: {', '.join(handler_names())}"
        ) from None
    params = inspect.signature(cls.__init__).parameters
    accepted = {k: v for k, v in options.items() if k in params and v is not None}
    return cls(**accepted)


register_handler(ArrowDocHandler)
