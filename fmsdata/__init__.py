"""fmsdata: a stateful, streaming, rescalable data loader for LLM pretraining.

The public names below are imported on first use (PEP 562), so ``import fmsdata`` and the
``fmsdata`` command line start without importing torch; ``from fmsdata import
build_dataloader`` works as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fmsdata.errors import (
    ConfigError,
    EmptyDatasetError,
    FmsDataError,
    MissingDependencyError,
    RemoteIOError,
    ShardFormatError,
    StateMismatchError,
    WorkerDiedError,
    WorkerStalledError,
)

if TYPE_CHECKING:
    from fmsdata.config import LoaderConfig
    from fmsdata.handlers import FileHandler, register_handler
    from fmsdata.loader import FmsDataLoader, build_dataloader
    from fmsdata.mapstyle import TokenWindowDataset, get_dataset

__all__ = [
    "LoaderConfig",
    "build_dataloader",
    "FmsDataLoader",
    "get_dataset",
    "TokenWindowDataset",
    "FileHandler",
    "register_handler",
    "FmsDataError",
    "ConfigError",
    "EmptyDatasetError",
    "ShardFormatError",
    "StateMismatchError",
    "RemoteIOError",
    "MissingDependencyError",
    "WorkerStalledError",
    "WorkerDiedError",
]

__version__ = "0.1.0"

# Public name -> module defining it, imported when the name is first looked up.
_LAZY = {
    "LoaderConfig": "fmsdata.config",
    "build_dataloader": "fmsdata.loader",
    "FmsDataLoader": "fmsdata.loader",
    "get_dataset": "fmsdata.mapstyle",
    "TokenWindowDataset": "fmsdata.mapstyle",
    "FileHandler": "fmsdata.handlers",
    "register_handler": "fmsdata.handlers",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fmsdata' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
