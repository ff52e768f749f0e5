"""The documents of one dataset inside one logical shard, in an order a subclass chooses.

A dataset's documents are dealt to the ``L`` logical shards by ``fmsdata.stages.deal``:
as a rule its files are cut into ``L`` fragments each and, laid end to end (file by
file), the ``F * L`` fragments go to the shards in contiguous runs of ``F`` (a shard reads
a few neighbouring files, one open file at a time); a dataset with a file that holds no
kept document (empty, or every document under ``min_length``), or whose files would leave a
shard without documents, is dealt by documents instead, over the files that hold a kept
one. Which applies is a function of the data and the config, found once per process
(``DocumentStream._plan``). Each epoch the shard walks its fragments in a keyed
random order, and the documents inside each fragment in another keyed order: position
``p`` of the walk maps to a document by arithmetic, so nothing is materialized and the
state is two integers.

That walk is ``RandomWalk``, one subclass of ``DocumentStream``; ``StoredOrder`` (config
``document_order: sequential``) drops both permutations: a shard reads its fragments in
file order and their documents in stored order, so with one logical shard the stream is the
files' own order of documents, and with several the shards' stretches, concatenated in
shard order, are that order (fragments are dealt in contiguous runs). Another order is
another subclass (``DocumentStream.walk_order``).

**Small datasets rotate.** When a dataset holds fewer (kept, decorated) tokens than
``n_shards`` lines, a shard's own portion is smaller than a line and the plain walk would
repeat its few documents inside one line; when its files that hold a kept document hold
fewer documents than ``n_shards``, some shard's portion is empty. Such a stream reads, in
epoch ``e``, the portion of shard ``order[(at + e) % n_shards]``, where ``order`` is a
keyed permutation of the shards (identity when sequential) and ``order[at]`` is the shard
itself, so epoch 0 is its own portion (an epoch whose portion holds no kept document is
passed); a *cycle* of ``n_shards`` epochs is walked as one (portions in that order,
each document order keyed by shard and cycle). Why the guarantees hold: for each ``e``
the map from shards to portions is a bijection, so every pass over all shards (epoch ``e``
of each) covers every document exactly once (G4); any ``n_shards`` consecutive epochs of a
shard read every portion once, so a document repeats inside a line only once the shard has
read the whole dataset; whether a dataset rotates, the portions and the walk depend only on
(data, config, seed, dataset, shard, epoch), never on rank, world size or worker (G2), and
the state is still ``(epoch, pos)`` (G1, G3). Datasets listed at 16 bytes per token of that
budget or more are not measured and never rotate.

The stream is read ahead in vectorized blocks and *committed* as the packer uses
documents, so ``state_dict`` always describes consumed documents only.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from fmsdata.config import DOCUMENT_ORDERS, Decoration
from fmsdata.errors import ConfigError, EmptyDatasetError, StateMismatchError
from fmsdata.stages.deal import (
    all_fragments,
    document_deal,
    file_deal_fits,
    shard_files,
    shard_fragments,
)
from fmsdata.stages.source import Documents, DocumentSource
from fmsdata.util.permute import Permutations, derive_key, hash_values, permute
from fmsdata.util.statecheck import need_count, need_int

__all__ = [
    "Decoration",
    "DocumentStream",
    "RandomWalk",
    "StoredOrder",
    "WalkOrder",
    "not_started",
    "stream_class",
    "all_fragments",
    "shard_fragments",
]

# Read-ahead starts small (a fast first batch) and grows fourfold up to _MAX_BLOCK documents,
# or more for short documents: up to _BLOCK_TOKENS tokens (each block costs a fixed number of
# vectorized steps, which short documents would otherwise pay per handful of lines), never
# past _MAX_BLOCK_SHORT. A block spans at most _MAX_FRAGMENTS fragments, so a stream holds
# few files open whatever the fragment size. Block sizes never change which documents come.
_FIRST_BLOCK = 16
_MAX_BLOCK = 1024
_BLOCK_TOKENS = 1 << 20
_MAX_BLOCK_SHORT = 8192
_MAX_FRAGMENTS = 8
# A dataset whose files list at least this many bytes per token of the rotation budget is
# not measured (no format stores a token in fewer bytes on average); see ``_rotates``.
_BYTES_PER_TOKEN = 16
# Files of a dataset that an error about it holding too few documents checks for damage.
_DAMAGE_CHECK_FILES = 64


@dataclasses.dataclass(frozen=True)
class WalkOrder:
    """The order of one cycle's walk over a stream's fragments (``DocumentStream.walk_order``).

    Attributes:
        order: A permutation of the fragment indices: the walk reads fragment ``order[0]``
            first, then ``order[1]``, ...
        keys: None to read each fragment's documents in stored order, or one 64-bit key per
            fragment *in walk order* (``fmsdata.util.permute.derive_key``): its documents are
            read in the keyed pseudo-random permutation of that key.
    """

    order: np.ndarray
    keys: Sequence[int] | np.ndarray | None = None


class DocumentStream(DocumentSource):
    """One dataset's documents in one logical shard, epoch after epoch: the base class of
    a document order.

    The stream owns everything but the order: which documents fall to the shard (its
    *fragments*, see the module docstring), rotation of small datasets, epochs, skipping
    documents shorter than ``min_length``, read-ahead and commits, state and its checks.
    A subclass says in which order a cycle reads the fragments and their documents
    (``walk_order``), and, for a rotating dataset, in which order the shards' portions
    come (``portion_order``). Both must be pure functions of (data, config, seed, dataset,
    shard, cycle) — never of rank, world size or worker — and ``walk_order`` must return
    a permutation: then every document is read once per epoch (G4) and a resume or a
    rescale continues exactly (G1-G3), whatever the order. Built in: ``RandomWalk`` (a
    seeded walk per epoch, ``document_order: random``) and ``StoredOrder``
    (``document_order: sequential``).

    State keys: ``epoch``, ``pos`` (next walk position in the epoch), ``docs`` and
    ``tokens`` (documents used, and their decorated tokens), ``skipped`` (documents passed
    over as too short), ``size`` (documents of one cycle, -1 before the stream first
    reads). Loading a state checks ``pos`` and ``size`` against the data.

    Args:
        access: The dataset's files, counts and readers in this worker.
        shard: Logical shard id.
        n_shards: Number of logical shards.
        seed: Run seed.
        decoration: Stripping, BOS/EOS and minimum length.
        line_tokens: Document tokens per line; a dataset holding fewer (decorated, kept)
            tokens than ``n_shards * line_tokens`` rotates (0: never).
        dataset: The dataset's index among the chain's datasets (what spans record). A
            mix change renumbers it: an order keys its walk by the dataset's name
            (``self.access.name``), never by this index.

    What an order may read: ``seed``, ``shard``, ``n_shards``, ``access.name`` (the
    dataset), ``rotating`` (a small dataset, see the module docstring), its own class
    attributes (its parameters, returned from ``settings``) and the fragments it is given.
    An order that keeps state of its own (``own_state``/``load_own_state``) extends
    ``fresh_state``.
    """

    role = "dataset"

    def __init__(
        self,
        access: Any,
        shard: int,
        n_shards: int,
        seed: int,
        decoration: Decoration,
        line_tokens: int = 0,
        dataset: int = 0,
    ):
        self.access = access
        self.shard = shard
        self.n_shards = n_shards
        self.seed = seed
        self.decoration = decoration
        self.line_tokens = line_tokens
        self.dataset = dataset
        self.epoch = 0
        self.pos = 0
        self.docs = 0
        self.tokens = 0
        self.skipped = 0
        self.rotating = False
        self._saved_size = -1  # size recorded in a loaded state, checked at setup
        self._rows: np.ndarray | None = None  # the cycle's fragments before the walk order
        self._row_epoch = np.zeros(0, dtype=np.int64)  # epoch within the cycle of each row
        self._epoch_starts = np.zeros(1, dtype=np.int64)  # cycle docs before each epoch, + total
        self._cycle_len = 1
        self._size = 0  # documents of one cycle
        self._walk_cycle = -1
        self._walk: np.ndarray = np.zeros((0, 3), dtype=np.int64)
        self._walk_ends: np.ndarray = np.zeros(0, dtype=np.int64)
        self._walk_firsts: np.ndarray = np.zeros(0, dtype=np.int64)  # where each fragment starts
        self._walk_orders: Permutations | None = None
        self._ahead = 0  # global position of the read-ahead cursor
        self._block_docs = _FIRST_BLOCK
        # Walk positions and running decorated lengths of the documents read ahead and not
        # committed, block by block.
        self._issued: collections.deque[tuple[np.ndarray, np.ndarray]] = collections.deque()
        self._issued_used = 0  # of the first block
        self._has_read = False  # size is saved once the stream has read (-1 before)

    # -- the order: what a subclass says ------------------------------------------------

    def walk_order(self, fragments: np.ndarray, cycle: int) -> WalkOrder:
        """The order in which cycle ``cycle`` reads ``fragments`` and their documents.

        Args:
            fragments: ``[n, 3]`` rows ``(file, first_doc, end_doc)``: the cycle's fragments
                in file order (a rotating stream: the portions of ``portion_order``, each
                in file order).
            cycle: The cycle: one epoch, or for a rotating stream (a small dataset, see the
                module docstring) ``n_shards`` epochs, epoch ``j`` of the cycle reading the
                ``j``-th portion. A rotating stream reads its cycle portion by portion
                whatever the order says: the fragments of each portion come in the relative
                order of ``order`` (and their ``keys`` with them), so any permutation keeps
                every epoch of every shard together a cover of the dataset.
        """
        raise NotImplementedError(f"{type(self).__name__} must define walk_order")

    def portion_order(self) -> np.ndarray:
        """A rotating stream's order of the shards' portions over a cycle: a permutation of
        ``range(n_shards)`` (default: shard order). The stream starts at its own portion."""
        return np.arange(self.n_shards)

    def settings(self) -> dict[str, Any]:
        """The dataset (its name keys the walk), decoration and the rotation threshold; a
        subclass adds what its order depends on (``{**super().settings(), ...}``)."""
        d = self.decoration
        return {
            "dataset": self.access.name,
            "bos": d.bos,
            "eos": d.eos,
            "strip": sorted(d.strip),
            "min_length": d.min_length,
            "line_tokens": self.line_tokens,
        }

    # -- setup ---------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Documents of one cycle: the shard's share of the dataset, or with a rotating
        stream the whole dataset."""
        self._setup()
        return self._size

    def reads(self, file: int, doc: int) -> bool:
        """Whether this stream reads document ``doc`` of ``file`` in some epoch: it lies in
        one of the shard's fragments (a rotating stream reads every shard's portion in
        turn). A document lies in one shard's fragments unless its dataset rotates, so
        ``fmsdata trace --doc`` follows that shard alone."""
        self._setup()
        rows = self._rows
        assert rows is not None, "set up above"
        hit = (rows[:, 0] == file) & (rows[:, 1] <= doc) & (doc < rows[:, 2])
        return bool(hit.any())

    def _rotates(self) -> bool:
        """Whether the dataset holds fewer tokens than a line per shard (the same answer in
        every shard: a function of the data and the config). Files listed at ``_BYTES_PER_TOKEN``
        bytes a token or more are too large to be measured: they never rotate."""
        if not self.line_tokens or self.n_shards == 1:
            return False
        budget = self.n_shards * self.line_tokens
        if int(np.sum(self.access.files.sizes)) >= budget * _BYTES_PER_TOKEN:
            return False
        return self.access.holds_fewer_tokens(self.decoration, budget)

    def _plan(self) -> tuple[bool, bool]:
        """Whether the dataset rotates, and whether its shares are the file deal (else the
        document deal): a function of the data and the config, the same in every shard,
        found once per process (``fmsdata.stages.deal`` says what each deal is).

        The file deal stays wherever it serves: every file holds a kept document and every
        shard gets documents (or the dataset rotates, which reads every portion in turn and
        so copes with empty ones). Otherwise the shares are computed over the documents of
        the files that hold a kept one; a dataset whose such files hold fewer documents
        than there are shards rotates.

        Raises:
            EmptyDatasetError: No file of the dataset holds a document that is kept.
        """
        n_shards = self.n_shards
        live = np.asarray(self.access.live_files(self.decoration), dtype=bool)
        counts = np.array(
            [self.access.doc_count(f) for f in range(self.access.num_files)], dtype=np.int64
        )
        if not live.any():
            raise EmptyDatasetError(self._nothing_message(counts))
        rotating = self._rotates() or int(counts[live].sum()) < n_shards
        file_deal = rotating or (bool(live.all()) and file_deal_fits(counts, n_shards))
        return rotating, file_deal

    def _nothing_message(self, counts: np.ndarray) -> str:
        """What a dataset without a single kept document holds, for its error."""
        name, n_files, docs = self.access.name, len(counts), int(counts.sum())
        empty = int((counts == 0).sum())
        if docs == 0:
            held = f"all its {n_files} file(s) are empty (no document)"
        else:
            d = self.decoration
            stripping = f" after stripping {sorted(d.strip)}" if d.strip else ""
            held = (
                f"every one of the {docs} document(s) in its {n_files} file(s) has fewer than "
                f"min_length={max(1, d.min_length)} tokens{stripping}"
                + (f" ({empty} of the files are empty)" if empty else "")
            )
        damage = self._damaged_files()
        return (
            f"dataset {name!r} holds no document to read: {held}"
            + (f"; damaged, read only up to the damage: {'; '.join(damage)}" if damage else "")
            + ("; restore the damaged file(s)" if damage else "")
        )

    def _setup(self) -> None:
        if self._rows is not None:
            return
        n_files, n_shards = self.access.num_files, self.n_shards
        self.rotating, file_deal = self.access.remembered(
            ("plan", type(self).__name__, self.decoration, n_shards, self.line_tokens),
            self._plan,
        )
        if self.rotating:
            counts = np.array([self.access.doc_count(f) for f in range(n_files)], dtype=np.int64)
            rows, owner = all_fragments(counts, n_shards)
            portions = _checked_permutation(self.portion_order(), n_shards, self, "portion_order")
            at = int(np.flatnonzero(portions == self.shard)[0])
            portions = portions[(at + np.arange(n_shards)) % n_shards]  # epoch 0: own portion
            per_portion = np.bincount(owner, minlength=n_shards)
            first_row = np.concatenate([[0], np.cumsum(per_portion)])
            picked = [np.arange(first_row[q], first_row[q + 1]) for q in portions]
            self._rows = rows[np.concatenate(picked)] if picked else rows[:0]
            self._row_epoch = np.repeat(np.arange(n_shards), per_portion[portions])
            self._cycle_len = n_shards
        else:
            if file_deal:
                counts = np.full(n_files, -1, dtype=np.int64)
                for f in shard_files(n_files, n_shards, self.shard):
                    counts[f] = self.access.doc_count(f)
                self._rows = shard_fragments(counts, n_shards, self.shard)
            else:
                counts = np.array(
                    [self.access.doc_count(f) for f in range(n_files)], dtype=np.int64
                )
                live = self.access.live_files(self.decoration)
                rows, owner = document_deal(counts, live, n_shards)
                self._rows = rows[owner == self.shard]
            self._row_epoch = np.zeros(len(self._rows), dtype=np.int64)
            self._cycle_len = 1
        sizes = self._rows[:, 2] - self._rows[:, 1]
        per_epoch = np.bincount(self._row_epoch, weights=sizes, minlength=self._cycle_len)
        self._epoch_starts = np.concatenate([[0], np.cumsum(per_epoch)]).astype(np.int64)
        self._size = int(self._epoch_starts[-1])
        if self._size == 0:  # the plan gives every shard documents, or rotates
            raise RuntimeError(
                f"dataset {self.access.name!r}: logical shard {self.shard} was dealt no document"
            )
        if self._saved_size >= 0 and self._saved_size != self._size:
            raise StateMismatchError(
                f"size: the state was saved with {self._saved_size} documents of dataset "
                f"{self.access.name!r} in logical shard {self.shard}'s cycle, this loader "
                f"deals it {self._size}: a setting that decides which documents the shard is "
                "dealt changed since the save (min_length, strip_tokens, bos/eos, "
                "logical_shards), or the dataset's files did"
            )
        j = self.epoch % self._cycle_len
        held = int(self._epoch_starts[j + 1] - self._epoch_starts[j])
        if self.pos >= held and self.pos > 0:
            raise StateMismatchError(
                f"pos: saved position {self.pos} is past the {held} documents of dataset "
                f"{self.access.name!r} in logical shard {self.shard}, epoch {self.epoch}"
            )
        # Start of an empty epoch (a rotating shard's own portion may be empty): the walk
        # goes on at the next epoch that holds documents.
        self.epoch, self.pos = self._local(self._global(self.epoch, self.pos))
        self._ahead = self._global(self.epoch, self.pos)

    def _damaged_files(self) -> list[str]:
        """What the handler says was lost from each of the dataset's files (a compressed
        file cut short, read leniently), for the error about a shard without documents: the
        cause is otherwise named only in a log line, maybe a worker's. Only asked of
        datasets of at most ``_DAMAGE_CHECK_FILES`` files (each is opened)."""
        access = self.access
        if access.num_files > _DAMAGE_CHECK_FILES:
            return []
        found = (access.handler.damage(access.reader(f)) for f in range(access.num_files))
        return [damage for damage in found if damage]

    def _global(self, epoch: int, pos: int) -> int:
        """Walk position counted from the stream's start."""
        if self._cycle_len == 1:
            return epoch * self._size + pos
        cycle, j = divmod(epoch, self._cycle_len)
        return cycle * self._size + int(self._epoch_starts[j]) + pos

    def _local(self, position: int) -> tuple[int, int]:
        """``(epoch, pos)`` of a walk position counted from the stream's start."""
        if self._cycle_len == 1:
            return divmod(position, self._size)
        cycle, rest = divmod(position, self._size)
        starts = self._epoch_starts[: self._cycle_len]
        j = int(np.searchsorted(starts, rest, side="right")) - 1
        return cycle * self._cycle_len + j, rest - int(starts[j])

    def _walk_for(self, cycle: int) -> None:
        """The cycle's fragment order, and each fragment's document order."""
        if cycle == self._walk_cycle:
            return
        rows = self._rows
        if rows is None:
            raise RuntimeError("a document stream is set up before it walks")
        walk = self.walk_order(rows.copy(), cycle)
        if not isinstance(walk, WalkOrder):
            raise ConfigError(
                f"{type(self).__name__}.walk_order must return a WalkOrder(order, keys) for "
                f"dataset {self.access.name!r}, got {type(walk).__name__}"
            )
        order = _checked_permutation(walk.order, len(rows), self, "walk_order")
        keys = None if walk.keys is None else _checked_keys(walk.keys, len(rows), self)
        if self._cycle_len > 1:
            # A rotating cycle reads its portions one epoch each, in portion order: the
            # order's fragments are regrouped by epoch, keeping their relative order inside
            # each (so any permutation keeps every pass over the shards a cover, G4).
            by_epoch = np.argsort(self._row_epoch[order], kind="stable")
            order = order[by_epoch]
            keys = None if keys is None else keys[by_epoch]
        self._walk = rows[order]
        sizes = self._walk[:, 2] - self._walk[:, 1]
        self._walk_orders = None if keys is None else Permutations(sizes, keys)
        self._walk_ends = np.cumsum(sizes)
        self._walk_firsts = self._walk_ends - sizes
        self._walk_cycle = cycle

    def prefetch_upcoming(self) -> None:
        """Tell the file source which file the next read opens, so that a remote root can
        start downloading it now (streams opened together then download in parallel)."""
        self._setup()
        cycle, pos = divmod(self._ahead, self._size)
        self._walk_for(cycle)
        fragment = int(np.searchsorted(self._walk_ends, pos, side="right"))
        self.access.prefetch(int(self._walk[fragment, 0]))

    # -- read ahead / commit -------------------------------------------------------------

    def read_ahead(self) -> Documents:
        """The next block of kept documents after the read-ahead cursor (never empty).

        A block covers a few files of the walk at most, so a stream keeps only a few files
        open at a time however small its fragments are.

        Raises:
            EmptyDatasetError: A whole cycle of the shard passed without a usable document.
        """
        self._setup()
        self._has_read = True
        passed = 0
        while True:
            block, walked = self._read_block()
            passed += walked
            if len(block):
                most = _BLOCK_TOKENS * len(block) // max(1, int(block.dlen.sum()))
                most = min(max(most, _MAX_BLOCK), _MAX_BLOCK_SHORT)
                self._block_docs = min(self._block_docs * 4, most)
                self._issued.append((block.gpos, np.cumsum(block.dlen)))
                return block
            if passed >= self._size:
                raise EmptyDatasetError(self._dead_share_message())

    def _dead_share_message(self) -> str:
        """The error of a shard whose share holds documents, none kept, while other files of
        the dataset hold kept ones: the shares are dealt by documents, and a run of skipped
        documents inside a file as long as a share fills it (see ``fmsdata.stages.deal``)."""
        rows = self._rows if self._rows is not None else np.zeros((0, 3), dtype=np.int64)
        files = sorted({self.access.path(int(f)) for f in rows[:, 0].tolist()})
        shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        return (
            f"dataset {self.access.name!r}: none of the {self._size} document(s) that logical "
            f"shard {self.shard} of {self.n_shards} is dealt ({shown}) has at least "
            f"min_length={max(1, self.decoration.min_length)} tokens, though the dataset holds "
            "such documents elsewhere (a run of short documents inside a file as long as a "
            "shard's share); use fewer logical_shards, or move the short documents out"
        )

    def _read_block(self) -> tuple[Documents, int]:
        cycle, pos = divmod(self._ahead, self._size)
        self._walk_for(cycle)
        ends = self._walk_ends
        first = int(np.searchsorted(ends, pos, side="right"))
        near = self._walk[first : first + self._block_docs, 0]
        switches = np.flatnonzero(np.diff(near))
        # At most _MAX_FRAGMENTS files per block (a row never holds fewer than one document).
        enough = len(switches) >= _MAX_FRAGMENTS
        last = first + (int(switches[_MAX_FRAGMENTS - 1]) if enough else len(near) - 1)
        stop = min(pos + self._block_docs, int(ends[last]))
        positions = np.arange(pos, stop, dtype=np.int64)
        frag = np.searchsorted(ends, positions, side="right")
        local = positions - self._walk_firsts[frag]
        orders = self._walk_orders
        docs = self._walk[frag, 1] + (local if orders is None else orders.apply(local, frag))
        files = self._walk[frag, 0]
        parts = []
        cuts = np.flatnonzero(np.diff(files)) + 1
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
        ds = np.full(len(positions), self.dataset, dtype=np.int64)
        block = Documents(ds, files, docs, content + self.decoration.extra, base, gpos)
        return (block if len(kept) == len(block) else block.select(kept)), len(positions)

    def commit(self, rows: int) -> None:
        """Mark the next ``rows`` read-ahead documents as used; the documents passed over
        before the last of them (too short) count as skipped."""
        if rows <= 0:
            return
        left, last = rows, -1
        while left:
            if not self._issued:
                raise RuntimeError(
                    f"dataset {self.access.name!r}: committed {rows} documents, more than were "
                    "read ahead"
                )
            gpos, ends = self._issued[0]
            used = self._issued_used
            take = min(left, len(gpos) - used)
            self.tokens += int(ends[used + take - 1]) - (int(ends[used - 1]) if used else 0)
            self._issued_used = used + take
            last = int(gpos[used + take - 1])
            if self._issued_used == len(gpos):
                self._issued.popleft()
                self._issued_used = 0
            left -= take
        current = self._global(self.epoch, self.pos)
        self.skipped += last + 1 - current - rows
        self.docs += rows
        self.epoch, self.pos = self._local(last + 1)

    def rewind(self) -> None:
        """Drop read-ahead: the next ``read_ahead`` starts at the consumed position."""
        if self._rows is not None:
            self._ahead = self._global(self.epoch, self.pos)
        self._issued.clear()
        self._issued_used = 0
        self._block_docs = _FIRST_BLOCK

    # -- state ---------------------------------------------------------------------------

    def fresh_state(self) -> dict[str, Any]:
        """The state of this stream before it starts. A subclass that keeps state of its
        own (``own_state``/``load_own_state``) adds its keys' starting values here: a
        dataset that a mix change adds is given ``not_started()``, the base keys only, and
        its stream loads them as this."""
        return not_started()

    def own_state(self) -> dict[str, Any]:
        size = self._size if self._has_read else self._saved_size
        return {
            "epoch": self.epoch,
            "pos": self.pos,
            "docs": self.docs,
            "tokens": self.tokens,
            "skipped": self.skipped,
            "size": size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load strictly (``Stage.load_state_dict``); ``not_started()`` (a dataset a mix
        change added) loads as this stream's ``fresh_state()``."""
        if dict(state) == not_started():
            state = self.fresh_state()
            missing = sorted(set(self.own_state()) - set(state))
            if missing:
                cls = type(self)
                raise ConfigError(
                    f"{cls.__module__}.{cls.__qualname__} keeps state keys {missing} of its own "
                    f"but its fresh_state() does not give them: dataset "
                    f"{self.access.name!r} starts fresh (a mix change added it) from "
                    "fresh_state(); define it as {**super().fresh_state(), <key>: <start>, ...}"
                )
        super().load_state_dict(state)

    def load_own_state(self, state: dict[str, Any]) -> None:
        """Take the position back and check it against the data (the stream's documents in
        this shard are counted: ``pos`` must lie inside its epoch, ``size`` must agree)."""
        size = need_int(state["size"], "size", -1)  # -1: saved before the stream started
        self.epoch = need_count(state["epoch"], "epoch")
        self.pos = need_count(state["pos"], "pos", max(size - 1, 0))
        self.docs = need_count(state["docs"], "docs")
        self.tokens = need_count(state["tokens"], "tokens")
        self.skipped = need_count(state["skipped"], "skipped")
        self._saved_size = size
        self._has_read = False
        self._rows = None  # set up again, against the loaded position
        self._walk_cycle = -1
        self.rewind()
        self._setup()

    @classmethod
    def report(cls, own: dict[str, Any]) -> dict[str, Any]:
        """Where the stream is: documents and tokens taken, epoch, position of ``size`` documents,
        documents skipped as shorter than ``min_length`` (``fmsdata.state.report`` files it
        under the dataset its settings name)."""
        return {
            "dataset": {
                "taken_docs": int(own.get("docs", 0)),
                "taken_tokens": int(own.get("tokens", 0)),
                "epoch": int(own.get("epoch", 0)),
                "pos": int(own.get("pos", 0)),
                "size": int(own.get("size", -1)),
                "skipped": int(own.get("skipped", 0)),
            }
        }


class RandomWalk(DocumentStream):
    """A seeded random walk per epoch (``document_order: random``): the shard's fragments
    in a keyed random order, the documents inside each in another; a rotating stream
    visits the shards' portions in a keyed order, its documents keyed per cycle."""

    def walk_order(self, fragments: np.ndarray, cycle: int) -> WalkOrder:
        n, name = len(fragments), self.access.name
        if self.rotating:
            key = derive_key(self.seed, name, self.shard, "cycle", cycle)
            return WalkOrder(np.arange(n), hash_values(key, 0, n))
        order = permute(np.arange(n), n, derive_key(self.seed, name, self.shard, cycle))
        keys = [derive_key(self.seed, name, self.shard, cycle, int(f)) for f in fragments[order, 0]]
        return WalkOrder(order, keys)

    def portion_order(self) -> np.ndarray:
        n = self.n_shards
        return permute(np.arange(n), n, derive_key(self.seed, self.access.name, "portions"))


class StoredOrder(DocumentStream):
    """The files' own order (``document_order: sequential``): fragments in file order,
    documents in stored order, every epoch alike. With one logical shard the stream is the
    dataset's order of documents; with several, the shards' stretches concatenated in
    shard order are (fragments are dealt in contiguous runs)."""

    def walk_order(self, fragments: np.ndarray, cycle: int) -> WalkOrder:
        return WalkOrder(np.arange(len(fragments)))


def not_started() -> dict[str, int]:
    """The base keys of a document stream that has not started (size -1: not measured):
    what a mix change gives a dataset it adds, whatever the stream's class."""
    return {"epoch": 0, "pos": 0, "docs": 0, "tokens": 0, "skipped": 0, "size": -1}


def stream_class(order: str) -> type[DocumentStream]:
    """The document stream of a config's ``document_order``."""
    if order not in _ORDERS:
        raise ConfigError(f"document_order must be one of {DOCUMENT_ORDERS}, got {order!r}")
    return _ORDERS[order]


_ORDERS: dict[str, type[DocumentStream]] = {"random": RandomWalk, "sequential": StoredOrder}


def _checked_keys(values: Any, n: int, stream: DocumentStream) -> np.ndarray:
    """``WalkOrder.keys`` as uint64: one integer in ``[0, 2**64)`` per fragment."""
    items: list[Any] | None
    try:
        items = values.tolist() if isinstance(values, np.ndarray) else list(values)
    except TypeError:
        items = None
    fits = (
        items is not None
        and len(items) == n
        and all(
            isinstance(k, (int, np.integer)) and not isinstance(k, bool) and 0 <= k < 2**64
            for k in items
        )
    )
    if not fits or items is None:
        raise ConfigError(
            f"{type(stream).__name__}.walk_order must give one integer key in [0, 2**64) per "
            f"fragment ({n}) of dataset {stream.access.name!r} in logical shard "
            f"{stream.shard}, or keys=None, got {values!r}"
        )
    return np.array([int(k) for k in items], dtype=np.uint64)


def _checked_permutation(values: Any, n: int, stream: DocumentStream, hook: str) -> np.ndarray:
    order = np.asarray(values)
    if (
        order.shape != (n,)
        or not np.issubdtype(order.dtype, np.integer)
        or not np.array_equal(np.sort(order), np.arange(n))
    ):
        raise ConfigError(
            f"{type(stream).__name__}.{hook} must give a permutation of range({n}) for dataset "
            f"{stream.access.name!r} in logical shard {stream.shard}, got {values!r}"
        )
    return order.astype(np.int64)
