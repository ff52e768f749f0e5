"""What a command names as ``MODULE:NAME``: a user's stage factory or format handler."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

from fmsdata.errors import ConfigError

__all__ = ["load_object"]


def load_object(spec: str, what: str) -> Any:
    """``MODULE:NAME`` (an importable module, or a ``.py`` file imported under its file
    name, so that DataLoader workers can unpickle what it defines) -> the object.

    Raises:
        ConfigError: Malformed, or nothing of that name.
    """
    module_name, sep, name = spec.rpartition(":")
    if not sep or not module_name or not name:
        raise ConfigError(f"{what} must be MODULE:NAME, got {spec!r}")
    if module_name.endswith(".py"):
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise ConfigError(f"{what} {spec!r}: no file {path}")
        stem = os.path.splitext(os.path.basename(path))[0]
        module = sys.modules.get(stem)
        if module is not None and os.path.abspath(getattr(module, "__file__", "") or "") != path:
            raise ConfigError(
                f"{what} {spec!r}: a module named {stem!r} is imported already "
                f"({getattr(module, '__file__', None) or 'built in'}); rename the file"
            )
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(stem, path)
            if loader_spec is None or loader_spec.loader is None:
                raise ConfigError(f"{what} {spec!r}: cannot import {path}")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[stem] = module
            loader_spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path:  # as for ``python -m``
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise ConfigError(f"{what} {spec!r}: cannot import {module_name!r} ({err})") from None
    try:
        return getattr(module, name)
    except AttributeError:
        raise ConfigError(f"{what} {spec!r}: {module_name} has no {name!r}") from None
