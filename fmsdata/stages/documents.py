"""The documents of one dataset inside one logical shard, in a seeded walk per epoch.

A dataset's files are cut into ``L`` fragments each; laid end to end (file by file), the
``F * L`` fragments are dealt to the ``L`` logical shards in contiguous runs of ``F``. A
shard therefore reads a few neighbouring files (one open file at a time) and needs the
document counts of those files only. Each epoch the shard walks its fragments in a keyed
random order, and the documents inside each fragment in another keyed order: position
``p`` of the walk maps to a document by arithmetic, so nothing is materialized and the
state is two integers.

The stream is read ahead in vectorized blocks and *committed* as the packer uses
documents, so ``state_dict`` always describes consumed documents only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fmsdata.errors import EmptyDatasetError, StateMismatchError
from fmsdata.permute import Permutations, derive_key, permute
from fmsdata.stages.base import check_keys
from fmsdata.statecheck import need_count, need_int

__all__ = ["Decoration", "DocBlock", "DocumentStream", "shard_fragments"]

STATE_KEYS = ("epoch", "pos", "docs", "skipped", "size")
# Read-ahead starts small (a fast first batch) and grows fourfold; a block spans at most this many
# fragments, so a stream holds few files open whatever the fragment size.
_FIRST_BLOCK = 16
_MAX_BLOCK = 1024
_MAX_FRAGMENTS = 8


@dataclasses.dataclass(frozen=True)
class Decoration:
    """How a stored document becomes the token sequence the packer sees.

    Up to one leading and one trailing token found in ``strip`` is removed, then ``bos``
    and ``eos`` are added when set. Documents with fewer than ``min_length`` tokens left
    (and always empty ones) are skipped and counted.
    """

    bos: int | None = None
    eos: int | None = None
    strip: frozenset[int] = frozenset()
    min_length: int = 1

    @property
    def extra(self) -> int:
        return (self.bos is not None) + (self.eos is not None)

    def strip_amounts(
        self, lengths: np.ndarray, first: np.ndarray, last: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Tokens removed at the start and at the end of each document (0 or 1 each)."""
        if not self.strip:
            zeros = np.zeros(len(lengths), dtype=np.int64)
            return zeros, zeros
        strip = np.fromiter(self.strip, dtype=np.int64)
        lead = ((lengths > 0) & np.isin(first, strip)).astype(np.int64)
        trail = ((lengths - lead > 0) & np.isin(last, strip)).astype(np.int64)
        return lead, trail


@dataclasses.dataclass
class DocBlock:
    """Read-ahead documents of one stream: kept documents only, in walk order."""

    file: np.ndarray  # file index within the dataset
    doc: np.ndarray  # document index within the file
    dlen: np.ndarray  # decorated length
    base: np.ndarray  # first kept token in the file's flat token buffer, -1 if none
    gpos: np.ndarray  # epoch * size + position in the walk (monotone)

    def __len__(self) -> int:
        return len(self.doc)

    def take(self, start: int, stop: int | None = None) -> DocBlock:
        return DocBlock(*(getattr(self, f)[start:stop] for f in _BLOCK_FIELDS))

    def select(self, index: np.ndarray) -> DocBlock:
        return DocBlock(*(getattr(self, f)[index] for f in _BLOCK_FIELDS))

    @staticmethod
    def concat(blocks: list[DocBlock]) -> DocBlock:
        if len(blocks) == 1:
            return blocks[0]
        return DocBlock(*(np.concatenate([getattr(b, f) for b in blocks]) for f in _BLOCK_FIELDS))

    @staticmethod
    def empty() -> DocBlock:
        e = np.zeros(0, dtype=np.int64)
        return DocBlock(e, e, e, e, e)


_BLOCK_FIELDS = ("file", "doc", "dlen", "base", "gpos")


def shard_fragments(counts: np.ndarray, n_shards: int, shard: int) -> np.ndarray:
    """Document ranges of one logical shard: rows ``(file, first_doc, end_doc)``, non-empty.

    ``counts`` needs to be correct only for the files the shard touches (the others may
    be -1); use ``shard_files`` to find which those are.
    """
    n_files = len(counts)
    rows = []
    for f in shard_files(n_files, n_shards, shard):
        lo_part = max(shard * n_files, f * n_shards) - f * n_shards
        hi_part = min((shard + 1) * n_files, (f + 1) * n_shards) - f * n_shards
        n = int(counts[f])
        lo, hi = n * lo_part // n_shards, n * hi_part // n_shards
        if hi > lo:
            rows.append((f, lo, hi))
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def shard_files(n_files: int, n_shards: int, shard: int) -> range:
    """Indices of the files whose fragments fall to ``shard``."""
    first = shard * n_files // n_shards
    last = ((shard + 1) * n_files - 1) // n_shards
    return range(first, last + 1)


def fresh_stream_state() -> dict[str, int]:
    """The state of a stream that has not started (size -1: not measured yet)."""
    return {"epoch": 0, "pos": 0, "docs": 0, "skipped": 0, "size": -1}


class DocumentStream:
    """One dataset's documents in one logical shard, epoch after epoch.

    The walk order is a pure function of (seed, dataset name, shard, epoch), never of
    rank, world size or worker. State keys: ``epoch``, ``pos`` (next walk position),
    ``docs`` (documents used), ``skipped`` (documents passed over as too short), ``size``
    (documents of the dataset in the shard, -1 before the stream first reads).

    Args:
        access: The dataset's files, counts and readers in this worker.
        shard: Logical shard id.
        n_shards: Number of logical shards.
        seed: Run seed.
        decoration: Stripping, BOS/EOS and minimum length.
    """

    def __init__(self, access: Any, shard: int, n_shards: int, seed: int, decoration: Decoration):
        self.access = access
        self.shard = shard
        self.n_shards = n_shards
        self.seed = seed
        self.decoration = decoration
        self.epoch = 0
        self.pos = 0
        self.docs = 0
        self.skipped = 0
        self._saved_size = -1  # size recorded in a loaded state, checked at setup
        self._fragments: np.ndarray | None = None
        self._size = 0
        self._walk_epoch = -1
        self._walk: np.ndarray = np.zeros((0, 3), dtype=np.int64)
        self._walk_ends: np.ndarray = np.zeros(0, dtype=np.int64)
        self._walk_orders: Permutations | None = None
        self._ahead = 0  # global position of the read-ahead cursor
        self._block_docs = _FIRST_BLOCK

    # -- setup ---------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Documents of this dataset in this shard (one epoch)."""
        self._setup()
        return self._size

    def _setup(self) -> None:
        if self._fragments is not None:
            return
        n_files = self.access.num_files
        counts = np.full(n_files, -1, dtype=np.int64)
        for f in shard_files(n_files, self.n_shards, self.shard):
            counts[f] = self.access.doc_count(f)
        self._fragments = shard_fragments(counts, self.n_shards, self.shard)
        self._size = int((self._fragments[:, 2] - self._fragments[:, 1]).sum())
        if self._size == 0:
            raise EmptyDatasetError(
                f"dataset {self.access.name!r} gives no document to logical shard {self.shard} "
                f"of {self.n_shards} (its {n_files} file(s) hold too few documents); use fewer "
                "logical_shards or more data"
            )
        if self._saved_size >= 0 and self._saved_size != self._size:
            raise StateMismatchError(
                f"size: the state was saved with {self._saved_size} documents of dataset "
                f"{self.access.name!r} in logical shard {self.shard}, the data now gives "
                f"{self._size}"
            )
        if self.pos >= self._size:
            raise StateMismatchError(
                f"pos: saved position {self.pos} is past the {self._size} documents of dataset "
                f"{self.access.name!r} in logical shard {self.shard}"
            )
        self._ahead = self.epoch * self._size + self.pos

    def _walk_for(self, epoch: int) -> None:
        """The epoch's fragment order, and each fragment's document order."""
        if epoch == self._walk_epoch:
            return
        frags = self._fragments
        assert frags is not None, "set up before walking"
        name = self.access.name
        order = permute(
            np.arange(len(frags)), len(frags), derive_key(self.seed, name, self.shard, epoch)
        )
        self._walk = frags[order]
        sizes = self._walk[:, 2] - self._walk[:, 1]
        self._walk_ends = np.cumsum(sizes)
        keys = [derive_key(self.seed, name, self.shard, epoch, int(f)) for f in self._walk[:, 0]]
        self._walk_orders = Permutations(sizes, keys)
        self._walk_epoch = epoch

    def prefetch_upcoming(self) -> None:
        """Tell the file source which file the next read opens, so that a remote root can
        start downloading it now (streams opened together then download in parallel)."""
        self._setup()
        epoch, pos = divmod(self._ahead, self._size)
        self._walk_for(epoch)
        fragment = int(np.searchsorted(self._walk_ends, pos, side="right"))
        self.access.prefetch(int(self._walk[fragment, 0]))

    # -- read ahead / commit -------------------------------------------------------------

    def read_ahead(self) -> DocBlock:
        """The next block of kept documents after the read-ahead cursor (never empty).

        A block covers a few fragments (files) of the walk at most, so a stream keeps only
        a few files open at a time however small its fragments are.

        Raises:
            EmptyDatasetError: A whole epoch of the shard passed without a usable document.
        """
        self._setup()
        passed = 0
        while True:
            block, walked = self._read_block()
            passed += walked
            if len(block):
                self._block_docs = min(self._block_docs * 4, _MAX_BLOCK)
                return block
            if passed >= self._size:
                raise EmptyDatasetError(
                    f"dataset {self.access.name!r}: no document in logical shard {self.shard} has "
                    f"at least min_length={self.decoration.min_length} tokens"
                )

    def _read_block(self) -> tuple[DocBlock, int]:
        epoch, pos = divmod(self._ahead, self._size)
        self._walk_for(epoch)
        ends = self._walk_ends
        first = int(np.searchsorted(ends, pos, side="right"))
        last = min(first + _MAX_FRAGMENTS, len(ends)) - 1
        stop = min(pos + self._block_docs, int(ends[last]))
        positions = np.arange(pos, stop, dtype=np.int64)
        frag = np.searchsorted(ends, positions, side="right")
        local = positions - (ends - (self._walk[:, 2] - self._walk[:, 1]))[frag]
        orders = self._walk_orders
        assert orders is not None, "walk computed above"
        docs = self._walk[frag, 1] + orders.apply(local, frag)
        files = self._walk[frag, 0]
        parts = []
        cuts = np.flatnonzero(np.diff(frag)) + 1
        for run in np.split(np.arange(len(positions)), cuts):
            file = int(files[run[0]])
            lengths, lead, trail, starts = self.access.measure(file, docs[run], self.decoration)
            base = starts + lead if starts is not None else np.full(len(run), -1, dtype=np.int64)
            parts.append((lengths - lead - trail, base))
        following = int(frag[-1]) + 1
        if following < len(self._walk):  # a remote root starts downloading it now
            self.access.prefetch(int(self._walk[following, 0]))
        content = np.concatenate([p[0] for p in parts])
        base = np.concatenate([p[1] for p in parts])
        kept = np.flatnonzero(content >= max(1, self.decoration.min_length))
        gpos = self._ahead + np.arange(len(positions), dtype=np.int64)
        self._ahead += len(positions)
        block = DocBlock(files, docs, content + self.decoration.extra, base, gpos)
        return block.select(kept), len(positions)

    def commit(self, last_gpos: int, used: int) -> None:
        """Mark documents up to walk position ``last_gpos`` as consumed, ``used`` of them kept."""
        current = self.epoch * self._size + self.pos
        nxt = last_gpos + 1
        self.skipped += nxt - current - used
        self.docs += used
        self.epoch, self.pos = divmod(nxt, self._size)

    def rewind(self) -> None:
        """Drop read-ahead: the next ``read_ahead`` starts at the consumed position."""
        if self._fragments is not None:
            self._ahead = self.epoch * self._size + self.pos
        self._block_docs = _FIRST_BLOCK

    # -- state ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        size = self._size if self._fragments is not None else self._saved_size
        return {
            "epoch": self.epoch,
            "pos": self.pos,
            "docs": self.docs,
            "skipped": self.skipped,
            "size": size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_keys(f"document stream {self.access.name!r}", state, STATE_KEYS)
        size = need_int(state["size"], "size", -1)  # -1: saved before the stream started
        self.epoch = need_count(state["epoch"], "epoch")
        self.pos = need_count(state["pos"], "pos", max(size - 1, 0))
        self.docs = need_count(state["docs"], "docs")
        self.skipped = need_count(state["skipped"], "skipped")
        self._saved_size = size
        self.rewind()
