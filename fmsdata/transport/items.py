"""What a DataLoader worker sends to the main process: its items, an error, the shards' states.

Passing tensors between processes has a high fixed cost per item, so a worker sends
several consecutive batches at once (its rows of each, ``fmsdata.transport.rounds``). The
worker writes its rows as the final batch tensors into the batch's slot of the ring in
shared memory (``fmsdata.transport.batchring``, ``fmsdata.transport.batchwrite``); the item
itself is small metadata: which batches went to their slots, where each row goes and which
shard made it. A round's last item also carries the whole state of each shard the round
advanced, at its end, as one opaque blob (``ShardStates``). What the main process consumed
moves to a shard's round-end state once the round's last item is consumed; in between it
counts the lines consumed past the last state (a resume replays them at span level, see
``fmsdata.loader.consumed``).
"""

from __future__ import annotations

import dataclasses
import pickle
import traceback
from collections.abc import Iterator
from typing import Any, NoReturn, cast

import numpy as np
import torch

from fmsdata.errors import FmsDataError
from fmsdata.stages.deferred import made

__all__ = ["WorkerItem", "WorkerError", "ShardStates", "carry_errors"]

# Blobs of shard states at least this large travel in shared memory (``ShardStates``).
_SHARED_BLOB = 1 << 16


@dataclasses.dataclass
class WorkerItem:
    """Rows of ``len(offsets) - 1`` consecutive batches produced by one worker.

    Attributes:
        offsets: [K + 1] start of each batch's rows in ``rows``.
        rows: [R] row index of each produced line inside its batch.
        first: Number of the item's first batch (``fmsdata.transport.batchring``).
        placed: [K] whether the worker's rows of each batch are in the batch's ring slot.
        overflow: [fields, R, seq] the rows of the batches not placed, in item order
            (None when every batch is placed, or a custom preprocess ran).
        segments: Flat document-piece lengths of every row (None unless requested).
        segment_counts: [R] pieces per row.
        segment_ids: Document id of each piece in ``segments`` (None unless requested).
        samples: Custom preprocess outputs, each [R, ...] (None on the built-in path).
        row_shards: [R] logical shard of each row.
        states: The state of each shard its round advanced, at the round's end (only a
            round's last item carries them: ``item_rounds``).
        state_lines: [len(states.shards)] lines each of those shards emitted in the round
            (what ``states`` are past the shard's previous state).
        mix_pieces: With a feedback mix (``mix_policy``): ``(lengths, counts, datasets)``,
            the input pieces of every row (flat), pieces per row, and the dataset of each
            piece (-1: padding); what ``record_loss`` attributes a loss by.
    """

    offsets: np.ndarray
    rows: np.ndarray
    row_shards: np.ndarray
    first: int
    placed: np.ndarray
    overflow: torch.Tensor | None
    segments: np.ndarray | None
    segment_counts: np.ndarray | None
    segment_ids: np.ndarray | None
    samples: dict[str, torch.Tensor] | None
    states: ShardStates
    state_lines: np.ndarray
    mix_pieces: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


class ShardStates:
    """``{shard id: shard state}`` of the shards a round advanced, pickled as one opaque
    blob to travel and unpickled only when a state is read (``get``): the main process
    holds the latest blob of each shard but reads it only to save a state or to start
    workers. Without workers nothing is pickled at all, and the states' ``Deferred`` parts
    (``fmsdata.stages.deferred``) are made only when a state is read.

    A large blob travels in shared memory (a uint8 tensor: the main process maps it and
    reads none of it until a state is taken). Through the pipe its bytes would be copied
    into fresh heap pages of the main process with every round: on 60-token documents
    (1.3 MiB of buffered spans a rank, a round of 256 batches) that doubled the main
    process's CPU a batch with one worker on the 2-core box, 14 -> 27 us.

    Attributes:
        shards: The shard ids, in the order the states were given.
    """

    __slots__ = ("shards", "_blob", "_states", "_made")

    def __init__(self, states: dict[int, dict[str, Any]]):
        self.shards = tuple(states)
        self._states: dict[int, dict[str, Any]] | None = states
        self._blob: bytes | torch.Tensor | None = None
        self._made: set[int] = set()  # shards whose state has no Deferred part left

    def __getstate__(self) -> tuple[tuple[int, ...], bytes | torch.Tensor]:
        if self._blob is None:
            blob = pickle.dumps(self._states, protocol=pickle.HIGHEST_PROTOCOL)
            if len(blob) >= _SHARED_BLOB:
                shared = torch.empty(len(blob), dtype=torch.uint8).share_memory_()
                shared.numpy()[:] = np.frombuffer(blob, dtype=np.uint8)
                self._blob = shared
            else:
                self._blob = blob
        return self.shards, self._blob

    def __setstate__(self, state: tuple[tuple[int, ...], bytes | torch.Tensor]) -> None:
        self.shards, self._blob = state
        self._states = None
        self._made = set(self.shards)  # pickling made every part

    def get(self, sid: int) -> dict[str, Any]:
        """Shard ``sid``'s state (shared: read it, do not change it)."""
        if self._states is None:
            blob = self._blob
            assert blob is not None
            # A tensor's numpy view is a buffer pickle reads in place (no copy).
            data = cast(bytes, blob.numpy()) if isinstance(blob, torch.Tensor) else blob
            self._states = pickle.loads(data)
            self._blob = None
        if sid not in self._made:
            made(self._states[sid])
            self._made.add(sid)
        return self._states[sid]


@dataclasses.dataclass(frozen=True)
class WorkerError:
    """An ``FmsDataError`` a DataLoader worker raised, sent to the main process as an item.

    PyTorch re-raises a worker's exception in the main process as a new one of the same
    class whose message is ``Caught X in DataLoader worker process N.`` followed by the
    worker's whole traceback, the cause on its last line. Sent as an item instead, the
    error is raised in the main process as it was made: same class, same message (which
    names the file and what is wrong). The worker's traceback rides along as a note, shown
    only where a full traceback is printed.
    """

    error_type: type[FmsDataError]
    message: str
    worker: int
    traceback: str

    def reraise(self) -> NoReturn:
        error = self.error_type(self.message)
        error.add_note(f"Raised in DataLoader worker process {self.worker}:\n{self.traceback}")
        raise error


def carry_errors(items: Iterator[Any], worker: int) -> Iterator[Any]:
    """A worker's items, ending with a ``WorkerError`` in place of an ``FmsDataError`` that
    can be rebuilt from its message (every fmsdata error can; a user's subclass that takes
    other arguments is left to PyTorch's own wrapping)."""
    try:
        yield from items
    except FmsDataError as err:
        if not _rebuilds(err):
            raise
        yield WorkerError(type(err), str(err), worker, traceback.format_exc())


def _rebuilds(err: FmsDataError) -> bool:
    """Whether ``type(err)(message)`` makes the same error again."""
    try:
        return str(type(err)(str(err))) == str(err)
    except Exception:
        return False
