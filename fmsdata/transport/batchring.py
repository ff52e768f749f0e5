"""Final-batch slots that the workers write and the main process hands out as they are.

The ring holds ``slots`` batches of every per-token output (``input_ids``, ``labels`` and,
on request, ``position_ids`` and ``document_ids``: ``[batch_size, seq_length]`` of the
output dtype, int64 or int32),
in shared memory when there are DataLoader workers. Batch number ``g`` (counted by the
loader over its iterations) lives in slot ``g % slots``; each worker writes its rows of
``g`` there at their canonical row positions, so the main process yields views of the
slot without reading a token.

Lifetime. A batch handed out may be kept by the caller for as long as it likes (logging,
gradient accumulation), so a slot is written again only once nothing of it is referenced:

- ``free_for[s]`` (shared) is the one batch number a worker may write into slot ``s``;
  a worker that finds another number there writes that batch into fresh memory of its
  item instead (``WorkerItem.overflow``) and never waits.
- The tensors handed out are ``torch.from_numpy`` tensors of numpy views of the slot, one
  per field, made once with the ring and kept: each tensor's storage holds a reference to
  its view for as long as any tensor, view, slice or ``.numpy()`` of it lives, so a view's
  reference count back at what it was before any hand-out says the slot is no longer
  used. The main process checks the slots it handed out at its next hand-out
  (``collect``, on the thread that hands out: no other thread writes the bookkeeping)
  and sets ``free_for[s]`` to the next batch number of that slot it has not handled.
- A slot whose batch was passed over (a skip) or went to fresh memory is free again at
  once; one still held keeps its number, lower than any the loader has yet to hand out.

Workers of one batch decide independently, so a batch can come partly in its slot and
partly in fresh memory (the slot was released between their checks); the main process
then copies it together (``fmsdata.transport.assemble.assemble_batch``), as it does when several
workers wrote to fresh memory. Both only happen to batches kept past a full turn of the
ring.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from fmsdata.errors import ConfigError

__all__ = ["BatchRing"]

# Where torch's shared memory lives on Linux (shm_open): containers often give it 64 MiB.
SHARED_MEMORY = "/dev/shm"


def shared_memory_free() -> int | None:
    """Bytes free in the shared-memory filesystem, or None where there is none to ask."""
    try:
        stat = os.statvfs(SHARED_MEMORY)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def move_to_shared_memory(
    tensors: Sequence[torch.Tensor], too_big: Callable[[int, str], str]
) -> None:
    """Move ``tensors`` into shared memory, or raise a ``ConfigError`` whose message is
    ``too_big(bytes needed, what was found)`` where the shared-memory filesystem has too
    little room for them (asked first) or torch cannot allocate them."""
    need = sum(t.nbytes for t in tensors)
    free = shared_memory_free()
    if free is not None and need > free:
        raise ConfigError(too_big(need, f"{SHARED_MEMORY} has {free / 2**20:.0f} MiB free"))
    try:
        for tensor in tensors:
            tensor.share_memory_()
    except RuntimeError as err:  # torch: "unable to allocate shared memory(shm) ..."
        raise ConfigError(too_big(need, str(err))) from err


class BatchRing:
    """``slots`` final batches of ``fields``, each ``[batch_size, seq]`` of ``dtype``.

    Args:
        slots: Batches the ring holds: what the workers can be ahead of the main process,
            plus what the caller keeps.
        fields: Names of the per-token outputs, in batch order.
        batch_size, seq: Shape of each output.
        shared: Put the ring in shared memory (for DataLoader workers).
        dtype: The outputs' dtype (``LoaderConfig.output_dtype``).
    """

    def __init__(
        self,
        slots: int,
        fields: Sequence[str],
        batch_size: int,
        seq: int,
        shared: bool,
        dtype: torch.dtype = torch.int64,
    ):
        self.slots = slots
        self.fields = tuple(fields)
        self.data = torch.empty((slots, len(self.fields), batch_size, seq), dtype=dtype)
        self.free_for = torch.arange(slots, dtype=torch.int64)
        if shared:
            move_to_shared_memory([self.data, self.free_for], self._too_big)
        self.position = 0  # the next batch number the main process handles
        self.in_use = False  # an iteration of the loader hands out from it
        self._setup()

    def _too_big(self, need: int, found: str) -> str:
        _, fields, batch_size, seq = self.data.shape
        kind = str(self.data.dtype).removeprefix("torch.")
        return (
            f"the DataLoader workers' batch ring needs {need / 2**20:.0f} MiB of shared memory "
            f"({self.slots} batches of {fields} x {batch_size} x {seq} {kind}: prefetch_factor "
            f"+ 2 items of every worker's batches) and {found}: give the process more shared "
            "memory (docker run --shm-size=..., or --ipc=host; in Kubernetes an emptyDir with "
            f"medium: Memory mounted at {SHARED_MEMORY}), or lower num_workers or prefetch_factor"
        )

    def _setup(self) -> None:
        self._data = self.data.numpy()
        self._free = self.free_for.numpy()
        # Main process only: each slot's field views (what the tensors handed out hold),
        # the references they have while nothing holds them, and the slots handed out
        # and not seen free since, in hand-out order.
        self._views = [list(self._data[slot]) for slot in range(self.slots)]
        self._idle = self._references(0)
        self._held: list[int] = []

    def __getstate__(self) -> dict[str, Any]:
        return {"slots": self.slots, "fields": self.fields, "data": self.data,
                "free_for": self.free_for, "position": self.position, "in_use": False}  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    # -- the writers' side (a worker, or the main process without workers) --------------

    def claim(self, batch: int) -> np.ndarray | None:
        """Slot ``[fields, batch_size, seq]`` to write batch ``batch`` into, or None while
        what the slot holds may still be in use (write the batch elsewhere)."""
        slot = batch % self.slots
        if self._free[slot] != batch:
            return None
        return self._data[slot]

    def claim_all(self, first: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The slot to write each of batches ``first:first + n`` into, -1 for those whose
        slot may still be in use (write them elsewhere), and the slots
        ``[slots, fields, batch_size, seq]`` the numbers index. A slot free for a batch
        stays free for it until the main process handles that batch, which it does only
        after the item that writes it arrived, or ``restart`` renumbers the ring: its new
        numbers are past every claim, and written only by workers started after these
        stopped. So the claims hold while the item is written (a slot freed meanwhile
        only sends its batch to fresh memory)."""
        batches = np.arange(first, first + n, dtype=np.int64)
        slots = batches % self.slots
        return np.where(self._free[slots] == batches, slots, -1), self._data

    # -- the main process's side ---------------------------------------------------------

    def hand_out(self, batch: int) -> list[torch.Tensor]:
        """Tensors of batch ``batch``'s fields, views of its slot (written there by every
        worker); the slot is written again only after all of them are gone."""
        assert batch == self.position, (batch, self.position)
        slot = batch % self.slots
        assert self._free[slot] == batch, "every part of the batch is in its slot"
        out = [torch.from_numpy(view) for view in self._views[slot]]
        self._held.append(slot)
        self.position = batch + 1
        return out

    def hand_out_pinned(self, batch: int) -> list[torch.Tensor]:
        """Tensors of batch ``batch``'s fields copied into pinned memory, each its own
        block (as the unpinned fields are views of their own field: keeping or saving
        one field never holds the others); the slot is free again at once. The copies are
        numpy's, on this thread alone: torch's ``copy_`` split them over its intra-op
        threads, which on a 16-core host took no less time and far more CPU (their waiting
        spins)."""
        assert batch == self.position, (batch, self.position)
        slot = batch % self.slots
        assert self._free[slot] == batch, "every part of the batch is in its slot"
        out = []
        for view in self._data[slot]:
            field = torch.empty(view.shape, dtype=self.data.dtype, pin_memory=True)
            np.copyto(field.numpy(), view)
            out.append(field)
        self.pass_over(batch)
        return out

    def _references(self, slot: int) -> int:
        """References to the field views of ``slot`` (each tensor handed out holds one);
        compared only with ``_idle``, counted the same way before any hand-out."""
        return sum(map(sys.getrefcount, self._views[slot]))

    def pass_over(self, batch: int) -> None:
        """Batch ``batch`` is handled without handing out its slot (passed over by a skip,
        or made of fresh memory): the slot is free for its next number, unless an earlier
        batch there is still held (it is freed when that one goes)."""
        assert batch == self.position, (batch, self.position)
        slot = batch % self.slots
        if self._free[slot] == batch:
            self._free[slot] = batch + self.slots
        self.position = batch + 1

    def collect(self) -> None:
        """Free the slots whose handed-out tensors are all gone: each is free for the next
        batch number of its own that is not handled yet."""
        if not self._held:
            return
        held = []
        for slot in self._held:
            if self._references(slot) > self._idle:
                held.append(slot)
            else:
                self._free[slot] = self.position + (slot - self.position) % self.slots
        self._held = held

    def restart(self, received: int) -> int:
        """Number the batches of a new iteration past everything the last one's workers
        may have written (up to a ring after ``received``, the end of the batches whose
        items arrived); slots not held are free for the new numbers. Returns the first."""
        self.collect()
        start = max(received, self.position) + self.slots
        free = self._free >= self.position  # not held by a batch handed out
        slots = np.arange(self.slots)
        self._free[free] = start + (slots[free] - start) % self.slots
        self.position = start
        return start
