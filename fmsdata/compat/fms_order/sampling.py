"""fms-fsdp's dataset mix: each new document comes from the dataset furthest below its
token share (``SamplingDataset``).

Weights are normalised as fms-fsdp does (``w / sum(w)`` in float); the deficit of
dataset ``i`` is ``w_i - seen_i / (sum(seen) + 1e-9)``, ties going to the *last* dataset;
``seen`` counts every token of every chunk, BOS/EOS included; a document is finished when
a chunk ends with the EOS value.

State keys: ``tokens_seen``, ``current_iterator`` (-1 between documents) and
``sample_iterator_states`` (one ``ShardMix`` state per dataset).
"""

from __future__ import annotations

from .docstream import Chunk
from .shardmix import ShardMix

__all__ = ["DatasetMix"]


class DatasetMix:
    def __init__(self, mixes: list[ShardMix], weights: list[float], eos: int):
        total = sum(weights)
        self.mixes, self.eos = mixes, eos
        self.weights = [w / total for w in weights]
        self.tokens_seen = [0] * len(mixes)
        self.current = -1

    def next_chunk(self) -> Chunk:
        if self.current == -1:
            seen = self.tokens_seen
            total = sum(seen) + 1e-9
            offsets = [self.weights[i] - seen[i] / total for i in range(len(seen))]
            self.current = max((d, i) for i, d in enumerate(offsets))[1]
        out = self.mixes[self.current].next_chunk()
        self.tokens_seen[self.current] += out[1]
        if out[2] == self.eos:
            self.current = -1
        return out

    def state(self) -> dict:
        return {
            "tokens_seen": list(self.tokens_seen),
            "current_iterator": self.current,
            "sample_iterator_states": [m.state() for m in self.mixes],
        }

    def load(self, state: dict, whole: bool) -> None:
        if whole:
            self.tokens_seen = [int(x) for x in state["tokens_seen"]]
            self.current = int(state["current_iterator"])
        for mix, sub in zip(self.mixes, state["sample_iterator_states"], strict=True):
            mix.load(sub, whole)
