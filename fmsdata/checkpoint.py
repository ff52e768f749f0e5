"""Saving and loading the loader state next to a model checkpoint: the public face of
``fmsdata.state.checkpoint`` (and of the ``torch.distributed.checkpoint`` planner and
reader, imported when first asked for)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fmsdata.state.checkpoint import (
    AutoCheckpointer,
    latest_checkpoint,
    load_loader_state,
    rank_file,
    rank_files,
    read_checkpoint,
    save_loader_state,
    step_folders,
)

if TYPE_CHECKING:
    from fmsdata.state.dcp_plan import LoadPlanner
    from fmsdata.state.dcp_read import SafeFileSystemReader

__all__ = [
    "save_loader_state",
    "load_loader_state",
    "read_checkpoint",
    "rank_file",
    "rank_files",
    "latest_checkpoint",
    "step_folders",
    "LoadPlanner",
    "SafeFileSystemReader",
    "AutoCheckpointer",
]


def __getattr__(name: str) -> Any:
    """``LoadPlanner`` and ``SafeFileSystemReader``, imported when first asked for."""
    from fmsdata.state import checkpoint

    return getattr(checkpoint, name)
