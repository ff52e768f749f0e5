"""fmsdata: a stateful, streaming, rescalable data loader for LLM pretraining."""

from fmsdata.config import LoaderConfig
from fmsdata.errors import (
    ConfigError,
    EmptyDatasetError,
    FmsDataError,
    RemoteIOError,
    ShardFormatError,
    StateMismatchError,
)
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
]

__version__ = "0.1.0"
