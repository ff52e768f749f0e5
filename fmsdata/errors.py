"""The exceptions fmsdata raises.

Each is built from one message string so that a DataLoader worker can re-raise it in the
main process unchanged.
"""

__all__ = [
    "FmsDataError",
    "ConfigError",
    "EmptyDatasetError",
    "ShardFormatError",
    "StateMismatchError",
    "RemoteIOError",
    "MissingDependencyError",
    "WorkerStalledError",
    "WorkerDiedError",
    "CheckpointWarning",
]


class FmsDataError(Exception):
    """Base class of every error fmsdata raises on purpose."""


class ConfigError(FmsDataError, ValueError):
    """A configuration value that cannot work; the message names the field and the value."""


class EmptyDatasetError(ConfigError):
    """A dataset, or a dataset's part in one logical shard, has no usable document."""


class ShardFormatError(FmsDataError):
    """A shard file is corrupt, truncated or not what the handler expects; names the file."""


class StateMismatchError(FmsDataError):
    """A saved loader state does not fit the loader it is loaded into; names field and values."""


class RemoteIOError(FmsDataError, OSError):
    """A remote read failed after every retry; names the URL and the last cause."""


class MissingDependencyError(FmsDataError, ImportError):
    """An optional package a feature needs is not installed; names the ``pip install`` fix."""


class WorkerStalledError(FmsDataError, RuntimeError):
    """A DataLoader worker sent nothing for ``worker_timeout`` seconds; names the worker,
    its logical shards, the stage and file it was in, and its Python stack."""


class WorkerDiedError(FmsDataError, RuntimeError):
    """A DataLoader worker was killed (by the OS, a signal, an abort); names the worker,
    its logical shards and how it ended."""


class CheckpointWarning(UserWarning):
    """An automatic checkpoint could not be written whole (its folder was removed while it
    was written, ...); names the folder. The run goes on; the next save is written anew."""
