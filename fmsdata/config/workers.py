"""The ``workers`` section: the processes that prepare batches, and what they hold."""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

from fmsdata.config.values import flag, non_negative_int, positive_int, set_field, to_number
from fmsdata.errors import ConfigError

__all__ = ["WorkersConfig", "StartMethod"]

StartMethod = Literal["fork", "spawn", "forkserver"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkersConfig:
    """How many worker processes a rank runs and how they hand batches over; none of it
    changes which tokens come.

    Attributes:
        num_workers: DataLoader worker processes per rank.
        prefetch_factor: Items (a few dozen batches of its rows) each worker prepares
            ahead; the workers' shared batch ring holds prefetch_factor + 2 items.
        pin_memory: Pin batch tensors (for asynchronous host-to-device copies).
        multiprocessing_context: ``"fork"``, ``"spawn"``, ``"forkserver"`` or None (default).
        open_files: Shard files each worker keeps open at most (least recently used closed);
            None sizes it from the streams the worker runs.
    """

    num_workers: int = 1
    prefetch_factor: int = 2
    pin_memory: bool = False
    multiprocessing_context: StartMethod | None = None
    open_files: int | None = None

    def __post_init__(self) -> None:
        set_field(self, "num_workers", non_negative_int("num_workers", self.num_workers))
        set_field(self, "prefetch_factor", positive_int("prefetch_factor", self.prefetch_factor))
        flag("pin_memory", self.pin_memory)
        if self.multiprocessing_context not in (None, *get_args(StartMethod)):
            raise ConfigError(
                "multiprocessing_context must be fork, spawn, forkserver or None, "
                f"got {self.multiprocessing_context!r}"
            )
        if self.open_files is not None:
            files = to_number("open_files", self.open_files, int)
            if files < 1:
                raise ConfigError(
                    f"open_files must be a positive integer or None, got {self.open_files!r}"
                )
            set_field(self, "open_files", files)
