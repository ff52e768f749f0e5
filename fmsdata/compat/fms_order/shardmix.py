"""One dataset's logical shards on one physical worker, drawn as fms-fsdp draws them.

fms-fsdp (``ScalableShardDataset``): a physical worker (rank ``r`` of ``W`` times
DataLoader workers, worker ``w`` of ``N`` giving ``r*N + w`` of ``W*N``) owns logical
shards ``p*L/P .. (p+1)*L/P - 1``. For each new document it draws a logical shard with
``torch.multinomial`` over the float counts of documents still to come this round,
from a ``torch.Generator`` seeded with the physical rank, and reads that shard until a
chunk ends with the EOS *value*. When every count reaches zero they refill and the
generator is seeded again. The same torch calls in the same order give the same draws on
the same torch build.

State keys: ``current_reader``, ``g_state`` (torch generator state, uint8),
``n_docs_remaining`` and ``logical_shard_states`` (one per owned logical shard).
"""

from __future__ import annotations

import numpy as np
import torch

from fmsdata.errors import EmptyDatasetError

from .docstream import Chunk, DocStream

__all__ = ["ShardMix"]


class ShardMix:
    def __init__(self, streams: list[DocStream], physical_rank: int, eos: int, folder: str):
        self.streams, self.rank, self.eos, self.folder = streams, physical_rank, eos, folder
        self.remaining = [s.n_docs for s in streams]
        self._set_weights()
        self.current: int | None = None
        self.generator = torch.Generator().manual_seed(physical_rank)

    def _set_weights(self) -> None:
        """The float counts multinomial draws over: a float32 numpy array (exact integers)
        kept in step with ``remaining``, seen by torch without a copy, instead of a new
        tensor per document."""
        self._counts = np.array(self.remaining, dtype=np.float32)
        self.weights = torch.from_numpy(self._counts)

    def next_chunk(self) -> Chunk:
        if self.current is None:
            if sum(self.remaining) <= 0:
                raise EmptyDatasetError(f"No documents detected in {self.folder}")
            self.current = int(torch.multinomial(self.weights, 1, generator=self.generator))
        ind = self.current
        out = self.streams[ind].next_chunk()
        if out[2] != self.eos:
            return out
        self.current = None
        self.remaining[ind] -= 1
        self._counts[ind] -= 1
        if sum(self.remaining) == 0:
            self.remaining = [s.n_docs for s in self.streams]
            self._set_weights()
            self.generator.manual_seed(self.rank)
        return out

    def state(self) -> dict:
        return {
            "current_reader": self.current,
            "g_state": self.generator.get_state().numpy().copy(),
            "n_docs_remaining": list(self.remaining),
            "logical_shard_states": [s.state() for s in self.streams],
        }

    def load(self, state: dict, whole: bool) -> None:
        """Load ``state``; with ``whole`` False (a rescaled fms-fsdp checkpoint) only the
        counts and logical shards, as fms-fsdp does."""
        if whole:
            self.current = state["current_reader"]
            if state["g_state"] is not None:
                self.generator.set_state(torch.tensor(np.asarray(state["g_state"], np.uint8)))
        self.remaining = [int(x) for x in state["n_docs_remaining"]]
        self._set_weights()
        for stream, sub in zip(self.streams, state["logical_shard_states"], strict=True):
            stream.load(sub)
