"""The rank-level IterableDataset: runs a rank's logical shards and yields batch parts.

Each DataLoader worker runs the shards it owns (``worker_shards``), deals every batch's
rows over *all* the rank's shards with the same rule, fills the rows that fall to its own
shards, and yields them (several batches per item, see ``fmsdata.transport.items``) with their
row positions and, at the end of each round of items, the states of the shards the round
advanced. The loader puts each batch back together in canonical order.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from fmsdata.config import LoaderConfig
from fmsdata.data.access import DatasetAccess, ReaderCache, make_accesses
from fmsdata.data.catalog import Catalog, discover
from fmsdata.data.dataformat import handler_for
from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.handlers.base import FileHandler
from fmsdata.handlers.derived import default_cache_dir
from fmsdata.handlers.mapping import resident_file_bytes
from fmsdata.remote import requests
from fmsdata.remote.cache import FileSource, file_source
from fmsdata.remote.storage import Storage
from fmsdata.stages.lineblock import LineBlock, SpanScratch
from fmsdata.stages.outputs import (
    TokenLine,
    document_ids_of,
    piece_segment_lengths,
    span_pieces,
)
from fmsdata.stages.shard import ShardRecipe, StageFactory
from fmsdata.transport.batchring import BatchRing
from fmsdata.transport.batchwrite import RowPieces, token_fields, write_batches
from fmsdata.transport.items import ShardStates, WorkerItem, carry_errors
from fmsdata.transport.rounds import item_batch_counts, item_rounds
from fmsdata.worker import stall
from fmsdata.worker.chain import ShardPipeline, build_pipeline, open_shard
from fmsdata.worker.materialize import LineWriter
from fmsdata.worker.topology import RowDealer, Topology, owned_shards, worker_shards

__all__ = ["RankLineDataset", "Preprocess", "Start"]

logger = logging.getLogger(__name__)

# Resident bytes of mapped shard files (over what was file-backed before reading) at which
# a worker gives their pages back. Streams walk documents in random order inside their
# files, so the pages of every file in use are the working set: a budget below it makes
# the worker fault the same pages in again and again (at 256 MiB the benchmark ran at half
# speed). The pages are the page cache's and reclaimable; the bound only keeps a long run
# over a large corpus from mapping all it ever read.
MAPPED_BUDGET = 1 << 30
# A document id's dataset field (``fmsdata.stages.outputs``: ``dataset << 56 | ...``).
_DATASET_SHIFT = 56

# A custom preprocess maps one packed line (int64, seq_length + 1 tokens) and its count of
# non-pad tokens to named arrays of fixed shapes; it replaces the built-in causal-LM shift.
Preprocess = Callable[[np.ndarray, int], Mapping[str, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Start:
    """Where an iteration of the rank's shards starts: the consumed position.

    Attributes:
        states: Per logical shard, a pipeline state it passed through (absent: not started).
        advance: Per logical shard, lines consumed after that state (replayed on start).
        emitted: Lines consumed from each of the rank's shards, in shard order (where the
            row dealing continues).
        ring: The final-batch ring the batches are written into (``fmsdata.transport.batchring``;
            None: every batch travels in its items). Every DataLoader worker writes into
            it; without workers, only the first iteration in this process started after
            ``start_at`` (the loader's own: it hands out what is written).
        first_batch: Ring number of the first batch.
        pids: Where each DataLoader worker writes its process id as it starts (a shared
            int64 tensor, one entry per worker; None without workers): the main process
            names a worker that died or stalled by it.
        paths: Per logical shard, where its state sat in the loaded state (what a refusal
            of it names).
        stacks: Where each DataLoader worker writes the descriptor of the file it dumps its
            stack into when asked (``fmsdata.worker.stall``; a shared int64 tensor like
            ``pids``; None: not asked for).
        calls: Where each DataLoader worker counts its calls to object storage
            (``fmsdata.remote.requests``; a shared int64 tensor, a row per worker; None:
            the worker counts in its own process only).
    """

    states: Mapping[int, Any] = dataclasses.field(default_factory=dict)
    advance: Mapping[int, int] = dataclasses.field(default_factory=dict)
    emitted: Sequence[int] | None = None
    ring: BatchRing | None = None
    first_batch: int = 0
    pids: torch.Tensor | None = None
    paths: Mapping[int, str] = dataclasses.field(default_factory=dict)
    stacks: torch.Tensor | None = None
    calls: torch.Tensor | None = None


@dataclasses.dataclass
class ShardContext:
    """What running logical shards in one process needs: open readers, per-dataset file
    access, the recipe of the stages; ``close`` when done."""

    readers: ReaderCache
    accesses: list[DatasetAccess]
    recipe: ShardRecipe
    source: FileSource

    def close(self) -> None:
        try:
            self.readers.close()
        finally:
            self.source.close()

    def open(self, shard: int, factory: StageFactory | None, **position: Any) -> ShardPipeline:
        """Shard ``shard``'s chain at a position (see ``fmsdata.worker.chain.open_shard``)."""
        return open_shard(shard, self.recipe, self.accesses, factory=factory, **position)


class _LineBuffer:
    """A process's int32 rows that the line writer fills for each item, kept from item to
    item (the rows are written out as the batches before the next item is made), and the
    span rows of a round's lines and of an item's (``SpanScratch``)."""

    def __init__(self, line_length: int):
        self._rows = np.empty((0, line_length), dtype=np.int32)
        self.round_spans = SpanScratch()
        self.item_spans = SpanScratch()
        self.spans_per_batch = 0.0  # in the last round (``item_rounds`` sizes rounds by it)

    def rows(self, n: int) -> np.ndarray:
        if n > len(self._rows):
            self._rows = np.empty((n, self._rows.shape[1]), dtype=np.int32)
        return self._rows[:n]


class RankLineDataset(IterableDataset):
    """Yields ``WorkerItem``s: this worker's rows of consecutive batches of the rank.

    The object is small when pickled, and made without reading anything: its format
    handler, storage and logical shards are found when first asked for, the catalog and
    all readers are built lazily in each process and dropped on pickling.

    Args:
        config: Loader config (completed by the root's ``metadata.json``).
        topology: Rank and world size.
        preprocess: Optional per-line function run in the workers instead of the built-in
            causal-LM shift (see ``Preprocess``).
        stages: Stage factory building each logical shard's chain (default:
            ``fmsdata.stages.shard.default_stages``).
    """

    def __init__(
        self,
        config: LoaderConfig,
        topology: Topology,
        preprocess: Preprocess | None = None,
        stages: StageFactory | None = None,
    ):
        self.config = config
        self.topology = topology
        self.preprocess = preprocess
        self.stages = stages
        # This rank's logical shards, in order (more ranks than shards is refused here).
        self.shard_ids = list(
            owned_shards(topology.rank, topology.world_size, config.logical_shards)
        )
        self.start = Start()
        self._ring: BatchRing | None = None
        self.drain_datasets: tuple[str, ...] = ()
        self.data_fingerprint: dict[str, str] | None = None
        self._catalog: Catalog | None = None
        self._layout: tuple[list[dict[str, Any]], dict[str, Any]] | None = None

    @functools.cached_property
    def handler(self) -> FileHandler:
        """The format handler the data section asks for."""
        return handler_for(self.config.data, self.config.documents.eos_token)

    @functools.cached_property
    def storage(self) -> Storage:
        """How the data root is reached (the remote section)."""
        return Storage.from_config(self.config.remote)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_catalog"] = None
        return state

    def start_at(self, start: Start) -> None:
        """Where the next iteration starts (the loader's consumed position)."""
        self.start = start
        # Without workers, claimed by the next iterator made in this process (the loader's).
        self._ring = start.ring if self.config.num_workers == 0 else None

    def drain(self, names: Sequence[str]) -> None:
        """Datasets dropped from the mix whose lines saved buffers still hold: readable
        until emitted (the catalog is listed again with them)."""
        names = tuple(names)
        if names != self.drain_datasets:
            self.drain_datasets = names
            self._catalog = self.data_fingerprint = None  # catalog() checks a set one
            self._layout = None
            self.data_fingerprint = self.catalog().fingerprint()

    def layout(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The chain every shard runs, as state fingerprints record it (stages with their
        paths, roles and settings), and the line writer's settings. Built once, in this
        process, without reading any document."""
        if self._layout is None:
            context = self.shard_context(1)
            try:
                pipeline = build_pipeline(
                    self.shard_ids[0] if self.shard_ids else 0,
                    context.recipe,
                    context.accesses,
                    self.stages,
                )
                self._layout = (pipeline.layout(), self.line_writer(context).settings())
            finally:
                context.close()
        return self._layout

    def line_writer(self, context: ShardContext) -> LineWriter:
        """What materializes the lines of shards opened in ``context``."""
        return LineWriter.for_config(context.accesses, context.recipe.decoration, self.config)

    @property
    def mix_names(self) -> list[str]:
        """The datasets being mixed (the catalog may hold more: see ``drain_datasets``)."""
        return [d.name for d in self.catalog().datasets][
            : len(self.catalog().datasets) - len(self.drain_datasets)
        ]

    def catalog(self) -> Catalog:
        """The data root's catalog (listed once per process): the config's datasets, then
        ``drain_datasets`` — ones dropped from the mix whose lines still sit in saved
        buffers and must be readable until they are emitted."""
        if self._catalog is None:
            names = (
                None
                if self.config.datasets is None
                else [*self.config.datasets, *self.drain_datasets]
            )
            catalog = discover(
                self.config.data_path,
                names,
                self.handler,
                self.storage,
                counts_dir=os.path.join(self.config.cache_dir or default_cache_dir(), "counts"),
            )
            if self.data_fingerprint is not None and catalog.fingerprint() != self.data_fingerprint:
                raise StateMismatchError(
                    f"the files under {self.config.data_path!r} changed while the loader ran "
                    f"(fingerprint {self.data_fingerprint} became {catalog.fingerprint()})"
                )
            self._catalog = catalog
        return self._catalog

    def shard_context(self, n_shards: int) -> ShardContext:
        """Readers, dataset accesses and the shard recipe for running ``n_shards`` shards."""
        catalog = self.catalog()
        # Each stream reads one file at a time, and buffered lines point into a few more.
        open_files = self.config.open_files or 2 * n_shards * len(catalog.datasets) + 16
        source = file_source(
            catalog.root,
            self.storage,
            os.path.join(self.config.cache_dir or default_cache_dir(), "remote"),
            int(self.config.remote_cache_gb * (1 << 30)),
            self.handler.companions,
        )
        # An open reader pins its file in a remote cache: beyond remote_cache_gb, readers
        # close (least recently used) down to one per stream, so their files can go.
        readers = ReaderCache(
            open_files,
            over_limit=getattr(source, "over_limit", None),
            floor=n_shards * len(catalog.datasets) + 16,
        )
        accesses = make_accesses(catalog, self.handler, source, readers)
        recipe = ShardRecipe.from_config(self.config, self.mix_names)
        return ShardContext(readers, accesses, recipe, source)

    def __iter__(self) -> Iterator[WorkerItem]:
        # In process, the ring is claimed here, when the iterator is made (the loader makes
        # its own right after ``start_at``), not when it first runs.
        ring, self._ring = self._ring, None
        info = get_worker_info()
        if info is None:
            return self._items(ring)
        stall.arm(self.start.stacks, info.id)
        if self.start.calls is not None:
            requests.count_into(self.start.calls[info.id].numpy())
        if self.start.pids is not None:
            self.start.pids[info.id] = os.getpid()
        # In a worker, an fmsdata error travels as an item: the main process raises it
        # as it was made, not as PyTorch's rebuilt copy with the worker's traceback inside.
        return carry_errors(self._items(self.start.ring), info.id)

    def _items(self, ring: BatchRing | None) -> Iterator[WorkerItem]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        config = self.config
        mine = set(worker_shards(len(self.shard_ids), worker, num_workers, config.batch_size))
        context = self.shard_context(len(mine))
        readers = context.readers
        if info is not None:
            stall.watch(readers, context.accesses)  # the file a stall report names
        writer = self.line_writer(context)
        start = self.start
        shards: dict[int, ShardPipeline] = {}

        def shard(local: int) -> ShardPipeline:
            pipeline = shards.get(local)
            if pipeline is None:
                sid = self.shard_ids[local]
                pipeline = shards[local] = context.open(
                    sid,
                    self.stages,
                    state=start.states.get(sid),
                    advance=start.advance.get(sid, 0),
                    writer=writer,
                    where=start.paths.get(sid, ""),
                    measure=not context.source.downloads,
                )
            return pipeline

        if context.source.downloads:
            # Open every shard now so their first files download in parallel; local roots
            # open shards as rows reach them (first batch independent of the shard count).
            # A shard that replays lines on opening reads its files to do so: it opens when
            # its rows come, or a resume would download every shard's files first.
            for local in sorted(mine):
                if not start.advance.get(self.shard_ids[local], 0):
                    shard(local)
        else:
            # A resumed shard opens now: its stages check the loaded state against the data
            # before the first item, so a damaged state is refused before any batch.
            for local in sorted(mine):
                if start.states.get(self.shard_ids[local]) is not None:
                    shard(local)
        emitted = start.emitted if start.emitted is not None else [0] * len(self.shard_ids)
        dealer = RowDealer(list(emitted))
        counts = item_batch_counts(config.batch_size, config.line_length, num_workers)
        if self.preprocess is not None:
            ring = None
        buffer = _LineBuffer(config.line_length)
        # File-backed memory before any shard is read (libraries, the ring): not ours to give back.
        baseline = resident_file_bytes() or 0
        try:
            first = start.first_batch
            for sizes in item_rounds(counts, lambda: buffer.spans_per_batch):
                round_items = self._round(sizes, dealer, mine, shard, writer, buffer, ring, first)
                for item in round_items:
                    yield item
                    first += len(item.offsets) - 1
                    # Pages read through memory maps stay resident until given back: keep
                    # the worker's memory flat however much of the corpus it has read.
                    mapped = resident_file_bytes()
                    if mapped is not None and mapped - baseline > MAPPED_BUDGET:
                        readers.release()
        finally:
            context.close()

    def _round(
        self,
        sizes: Sequence[int],
        dealer: RowDealer,
        mine: set[int],
        shard: Callable[[int], ShardPipeline],
        writer: LineWriter,
        buffer: _LineBuffer,
        ring: BatchRing | None,
        first: int,
    ) -> Iterator[WorkerItem]:
        """The items of one round (``sizes``: batches per item), made one at a time.

        Each shard's lines of the whole round are pulled in one ``take`` and its state is
        taken once, after the round's last item (and its token stages): the fixed cost of
        visiting a shard is paid once a round. The other items carry no shard state; the
        main process counts their lines as an advance past the shards' last state
        (``fmsdata.loader.consumed``). The spans pulled per batch size the next round
        (``buffer.spans_per_batch``).
        """
        deals = [self._deal(n_batches, dealer, mine) for n_batches in sizes]
        round_locals = [local for deal in deals for local in deal[1]]
        opened = {local: shard(local) for local in dict.fromkeys(round_locals)}
        wanted = collections.Counter(round_locals)
        pulled = LineBlock.concat(
            [p.take_lines(wanted[local]) for local, p in opened.items()], buffer.round_spans
        )
        buffer.spans_per_batch = len(pulled.spans) / sum(sizes)
        # The round's rows, grouped by shard in ``opened`` order and in row order within a
        # shard, are the lines pulled, in order: each row's line number.
        group = dict(zip(opened, range(len(opened))))
        by_shard = np.argsort(
            np.fromiter(map(group.__getitem__, round_locals), np.int64), kind="stable"
        )
        which = np.empty(len(round_locals), dtype=np.int64)
        which[by_shard] = np.arange(len(round_locals))
        at = 0
        for k, (rows, row_locals, offsets) in enumerate(deals):
            lines = pulled.gather(which[at : at + len(rows)], buffer.item_spans)
            at += len(rows)
            last = k == len(deals) - 1
            yield self._item(
                lines,
                rows,
                [self.shard_ids[local] for local in row_locals],
                [opened[local] for local in row_locals],
                offsets,
                writer,
                buffer,
                ring,
                first,
                # The round's shards and their lines, whose state the last item carries.
                {self.shard_ids[local]: (p, wanted[local]) for local, p in opened.items()}
                if last
                else {},
            )
            first += len(offsets) - 1

    def _deal(
        self, n_batches: int, dealer: RowDealer, mine: set[int]
    ) -> tuple[list[int], list[int], list[int]]:
        """The rows of ``n_batches`` batches that fall to this worker's shards: ``(row in
        its batch, local shard, offsets)`` (batch ``k``'s rows at ``offsets[k:k + 2]``)."""
        rows: list[int] = []
        row_locals: list[int] = []
        offsets = [0]
        batch_size = self.config.batch_size
        for _ in range(n_batches):
            for row, local in enumerate(dealer.deal(batch_size)):
                if local in mine:
                    rows.append(row)
                    row_locals.append(local)
            offsets.append(len(rows))
        return rows, row_locals, offsets

    def _item(
        self,
        lines: LineBlock,
        rows: list[int],
        row_shards: list[int],
        pipelines: list[ShardPipeline],
        offsets: list[int],
        writer: LineWriter,
        buffer: _LineBuffer,
        ring: BatchRing | None,
        first: int,
        touched: dict[int, tuple[ShardPipeline, int]],
    ) -> WorkerItem:
        """One item of ``lines`` (in row order) written as its batches; where ``touched``
        (``{shard id: (pipeline, lines of the round)}``, given to the round's last item),
        with the state of those shards at the round's end."""
        config = self.config
        n_batches = len(offsets) - 1
        tokens = buffer.rows(len(lines))
        token_stages = any(p.token_stages for p in pipelines)
        pending = None
        if token_stages or self.preprocess is not None:  # they read the whole rows
            content = writer.write(lines, tokens)  # refuses ids outside int32 or the vocab
        else:  # the pieces are copied a batch at a time as the batches are written
            content, pending = writer.lay_out(lines, tokens)
        has_bol, has_eol = config.bol_token is not None, config.eol_token is not None
        token_lines: list[TokenLine] | None = None
        if token_stages:
            # In the order each shard emitted its lines: token stages' state is per line. A
            # line's spans are copied: the item's block is reused by the next item, and a
            # stage may keep what it was given.
            token_lines = [
                TokenLine.of(lines.line(i).copy(), has_bol, has_eol) for i in range(len(lines))
            ]
            for i, pipeline in enumerate(pipelines):
                if pipeline.token_stages:
                    content[i] = pipeline.apply_tokens(tokens[i], int(content[i]), token_lines[i])
        # Taken after the token-level stages saw the round's lines.
        states = {sid: pipeline.state_dict(deferred=True) for sid, (pipeline, _) in touched.items()}
        segments = segment_counts = segment_ids = None
        # A mix that follows the loss attributes it by the dataset of each input token.
        feedback = config.mix_policy is not None
        want_ids = config.return_document_ids or feedback
        if config.return_position_ids or config.return_cu_seqlens or want_ids:
            ids = None
            if token_lines is None:  # the pieces are the spans
                lengths, counts = span_pieces(lines, has_bol, has_eol)
                if want_ids:
                    ids = document_ids_of(lines.spans)
            else:
                lengths = np.concatenate([line.pieces for line in token_lines])
                counts = np.array([len(line.pieces) for line in token_lines], dtype=np.int64)
                if want_ids:
                    ids = np.concatenate([line.ids for line in token_lines])
            segments, segment_counts, segment_ids = piece_segment_lengths(
                lengths, counts, content, config.seq_length, ids
            )
        samples = overflow = None
        offsets_np = np.asarray(offsets, dtype=np.int64)
        rows_np = np.asarray(rows, dtype=np.int64)
        placed = np.zeros(n_batches, dtype=bool)
        if self.preprocess is not None:
            samples = self._run_preprocess(self.preprocess, tokens, content)
        else:
            fields = token_fields(config.return_position_ids, config.return_document_ids)
            pieces = None
            if segments is not None and segment_counts is not None and len(fields) > 2:
                pieces = RowPieces(
                    segments, segment_counts, segment_ids if config.return_document_ids else None
                )
            placed, overflow = write_batches(
                ring, first, fields, offsets_np, rows_np, tokens, content, pieces, pending,
                dtype=getattr(torch, config.output_dtype),
                masked=config.ignore_first_labels,
            )  # fmt: skip
        mix_pieces = None
        if (
            feedback
            and segments is not None
            and segment_counts is not None
            and segment_ids is not None
        ):
            datasets = np.where(segment_ids < 0, -1, segment_ids >> _DATASET_SHIFT)
            mix_pieces = (segments, segment_counts, datasets)
        if not config.return_cu_seqlens:  # the rest of the structure is written already
            segments = segment_counts = segment_ids = None
        segment_ids = None  # the ids are written; cu_seqlens needs the lengths only
        return WorkerItem(
            offsets=offsets_np,
            rows=rows_np,
            row_shards=np.asarray(row_shards, dtype=np.int64),
            first=first,
            placed=placed,
            overflow=overflow,
            segments=segments,
            segment_counts=segment_counts,
            segment_ids=segment_ids,
            samples=samples,
            states=ShardStates(states),
            state_lines=np.array([n for _, n in touched.values()], dtype=np.int64),
            mix_pieces=mix_pieces,
        )

    @staticmethod
    def _run_preprocess(
        preprocess: Preprocess, tokens: np.ndarray, content: np.ndarray
    ) -> dict[str, torch.Tensor]:
        outputs: dict[str, list[np.ndarray]] = {}
        for line, n in zip(tokens.astype(np.int64), content.tolist()):
            sample = preprocess(line, n)
            if not isinstance(sample, Mapping):
                raise ConfigError(
                    f"preprocess must return a mapping of arrays, got {type(sample).__name__}"
                )
            for key, value in sample.items():
                outputs.setdefault(key, []).append(np.asarray(value))
        try:
            return {k: torch.from_numpy(np.stack(v)) for k, v in outputs.items()}
        except ValueError as err:
            raise ConfigError(
                f"preprocess outputs must have the same shape for every line: {err}"
            ) from None
