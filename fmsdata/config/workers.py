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
        worker_timeout: Seconds the main process waits for a worker's next item (a few
            dozen batches) before it asks the worker for its Python stack and raises
            ``WorkerStalledError`` naming the worker, its logical shards, the stage and file
            it is in, and the stack. The default, 600, is far beyond any healthy item
            (downloading a worker's first files from object storage included); None or 0
            waits forever. A dead worker is reported at once, whatever this is. Without
            workers (``num_workers=0``) the stages run in the training process itself,
            where nothing can watch them.
    """

    num_workers: int = 1
    prefetch_factor: int = 2
    pin_memory: bool = False
    multiprocessing_context: StartMethod | None = None
    open_files: int | None = None
    worker_timeout: float | None = 600.0

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
        if self.worker_timeout is not None:
            timeout = to_number("worker_timeout", self.worker_timeout, float)
            if not timeout >= 0 or timeout == float("inf"):
                raise ConfigError(
                    "worker_timeout must be a non-negative number of seconds or None (0 and "
                    f"None: wait forever), got {self.worker_timeout!r}"
                )
            set_field(self, "worker_timeout", timeout or None)
