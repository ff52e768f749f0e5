"""``FmsDataLoader``: the stateful DataLoader over a rank's logical shards."""

from __future__ import annotations

import collections
import dataclasses
import logging
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader

from fmsdata.config import LoaderConfig
from fmsdata.errors import ConfigError, FmsDataError, ShardFormatError
from fmsdata.handlers import fault_note
from fmsdata.handlers.mapping import changed_in_dead_workers
from fmsdata.loader import resume
from fmsdata.loader.consumed import ConsumedState
from fmsdata.loader.feed import PIN_AHEAD, RUNNING, AheadFeed, Feed
from fmsdata.loader.feedback import (
    MixFeedback,
    attribute,
    check_loss,
    counted_tokens,
    resumed,
)
from fmsdata.loader.workerwait import WatchedItems, dead_workers, died_error, poll_seconds
from fmsdata.remote import requests
from fmsdata.state.checkpoint import AutoCheckpointer, resume_from_folder
from fmsdata.state.fingerprint import SEQ_LENGTH, seq_length_change, stream_fingerprint
from fmsdata.state.format import LoaderState, ShardEntry
from fmsdata.state.mixrecord import MixRecord
from fmsdata.transport.assemble import assemble_batch
from fmsdata.transport.batchring import BatchRing
from fmsdata.transport.batchwrite import token_fields
from fmsdata.transport.items import WorkerItem
from fmsdata.transport.pieces import token_datasets
from fmsdata.transport.rounds import item_batch_counts, ring_slots
from fmsdata.util.digest import batch_digest, digest_int64
from fmsdata.util.exits import finish_at_exit
from fmsdata.worker.dataset import RankLineDataset, Start
from fmsdata.worker.topology import RowDealer, worker_shards

__all__ = ["FmsDataLoader", "as_tuple", "due_skips"]

logger = logging.getLogger(__name__)

# Batches handed out whose loss may be reported later (a trainer that fetches ahead).
_UNRECORDED = 8


def _keep(part: Any) -> Any:
    return part


class FmsDataLoader(DataLoader):
    """A DataLoader over a rank's logical shards whose state is exactly what was consumed.

    Iterating yields batches (dicts of tensors, or tuples: ``batch_format``).
    ``state_dict()`` after any batch, loaded into a loader built from the same config in a
    fresh process — on the same or another world size — continues with the batch that
    would have come next. Each ``iter()`` continues from the consumed position; workers
    are started per iteration.
    """

    def __init__(self, dataset: RankLineDataset):
        config = dataset.config
        workers = config.num_workers
        super().__init__(
            dataset,
            batch_size=None,
            num_workers=workers,
            collate_fn=_keep,
            pin_memory=False,  # batches are pinned after assembly
            prefetch_factor=config.prefetch_factor if workers > 0 else None,
            multiprocessing_context=config.multiprocessing_context if workers > 0 else None,
            # A bounded wait for each item, asked again until worker_timeout (WatchedItems).
            timeout=poll_seconds(config.worker_timeout) if workers > 0 else 0,
        )
        self.config: LoaderConfig = config
        # The mix as configured: with ``mix_policy`` the config's weights are the ones
        # applied now (``_use_weights``), these the ones the run started with.
        self._configured_mix = config.mix
        # A mix that follows the loss (``record_loss``), made at the first use; the
        # history of a loaded state whose run had one, where this loader has none.
        self._feedback: MixFeedback | None = None
        self._kept_mix: MixRecord | None = None
        # (step, dataset of each input token) of batches handed out, not yet recorded.
        self._unrecorded: collections.deque[tuple[int, Any]] = collections.deque()
        # Made at the first use (``_prepare``): nothing is read while the loader is built.
        self._consumed_state: ConsumedState | None = None
        self.checkpointer: AutoCheckpointer | None = None
        # A loaded state's mix change, applied at the next iteration (``_settle``).
        self._mix_change: resume.MixChange | None = None
        self._parts: Any = None
        self._generation = 0  # bumped by load_state_dict(): a running iteration restarts
        self._pending_skip = 0  # skipped batches the running iteration has yet to pass over
        # Where the workers of the running iteration write their process ids.
        self._pids: torch.Tensor | None = None
        # Where they write the descriptor of their stack file (``fmsdata.worker.stall``).
        self._stacks: torch.Tensor | None = None
        # Where the workers of every iteration count their calls to object storage.
        self._calls: torch.Tensor | None = None
        # Final batches written by the workers, made at the first iteration and kept.
        self._ring: BatchRing | None = None
        self._iterations: weakref.WeakSet[Iterator[Any]] = weakref.WeakSet()
        # At exit, while every module is still whole: finish its pending checkpoint save
        # and close the files and workers of iterations still running.
        finish_at_exit(self.close, "closing the data loader")

    @property
    def _consumed(self) -> ConsumedState:
        """What was consumed (``fmsdata.loader.consumed``), once the loader is prepared."""
        self._prepare()
        assert self._consumed_state is not None
        return self._consumed_state

    @_consumed.setter
    def _consumed(self, consumed: ConsumedState) -> None:
        self._consumed_state = consumed

    def _prepare(self) -> None:
        """What building the loader leaves to its first use (an iteration, a state taken or
        loaded, a skip), done once: the data root listed and checked, the chain the stage
        factory builds checked, the automatic checkpointer made and, where
        ``checkpoint_dir`` holds a complete checkpoint, the newest loaded.

        Raises:
            ConfigError: Missing data, a chain that cannot run (named).
            EmptyDatasetError: A dataset without documents.
        """
        if self._consumed_state is not None:
            return
        dataset: RankLineDataset = self.dataset  # type: ignore[assignment]
        dataset.data_fingerprint = dataset.catalog().fingerprint()
        dataset.layout()
        self._consumed_state = ConsumedState(dataset.shard_ids)
        if self.config.mix_policy is not None:
            self._feedback = MixFeedback(self._configured_mix, dataset.mix_names)
            self._use_weights(self._feedback.weights)
        storage = dataset.storage
        self.checkpointer = AutoCheckpointer.from_config(self.config.checkpoint, storage)
        if self.config.checkpoint_dir:
            resume_from_folder(self, self.config.checkpoint_dir, storage)

    # -- iteration -----------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._prepare()
        iteration = self._batches()
        self._iterations.add(iteration)
        return iteration

    def close(self) -> None:
        """Finish the checkpoint save in flight, then stop every iteration of this loader
        (its workers and open files go). Safe to call twice; iterating again afterwards
        continues from the consumed state. Runs by itself at interpreter exit.

        Raises:
            FmsDataError: The error of the pending save, if it failed (after the iterations
                are closed), whatever its class.
        """
        try:
            if self.checkpointer is not None:
                self.checkpointer.wait()
        finally:
            self._parts = None
            for iteration in list(self._iterations):
                if not iteration.gi_running:  # type: ignore[attr-defined]
                    iteration.close()  # type: ignore[attr-defined]

    def _batches(self) -> Iterator[Any]:
        tuples = self.config.batch_format != "dict"
        while True:
            generation = self._generation
            self._pending_skip = 0  # the workers start after every skip recorded so far
            parts, ring = self._start_workers()
            feed: Feed = Feed(parts, ring, max(1, self.num_workers), self._assemble)
            if self.config.pin_memory and self.num_workers > 0:
                # Batches are assembled straight into pinned memory on a side thread, a few
                # ahead; the training thread only does the bookkeeping of what it consumed.
                # Without workers the training thread makes every batch anyway and pins it
                # there: a side thread running the whole pipeline held the GIL, and each
                # hand-over waited for Python's switch interval (5 ms a batch).
                feed = AheadFeed(feed, PIN_AHEAD)
            restart = False
            RUNNING[id(parts)] = parts
            try:
                while not restart:
                    items, n_batches = self._next_items(feed)
                    k = 0
                    while True:
                        self._apply_configured_skips()
                        # Batches skipped meanwhile are counted as consumed already: pass
                        # over those the workers prepared; restart the workers after a longer
                        # skip, or a loaded state.
                        k, restart = self._pass_skipped(k, n_batches, generation)
                        if restart or k == n_batches:
                            break
                        batch = self._consume(items, feed.batch(k), k)
                        yield as_tuple(batch) if tuples else batch
                        k += 1
                    if not restart:
                        self._consumed.finish_items(items)
            finally:
                try:
                    feed.close()
                finally:
                    # Stopped here, not left to the DataLoader iterator's ``__del__``:
                    # see ``RUNNING``.
                    if self._parts is parts:
                        self._parts = None
                        self._pids = self._stacks = None
                    # The last reference but the local one: torch's ``__del__`` of the
                    # DataLoader iterator stops the workers when it goes, below.
                    RUNNING.pop(id(parts), None)
            # Workers restart from the consumed state (they fast-forward the skipped lines).
            del parts, feed

    @property
    def _fields(self) -> tuple[str, ...]:
        """The per-token outputs of a batch, in order."""
        return token_fields(self.config.return_position_ids, self.config.return_document_ids)

    def _assemble(
        self, items: list[WorkerItem], ring: BatchRing | None, k: int
    ) -> dict[str, torch.Tensor]:
        config = self.config
        batch = assemble_batch(
            items,
            ring,
            self._fields,
            k,
            config.batch_size,
            config.return_cu_seqlens,
            config.pin_memory,
        )
        if config.return_step_digest:
            digest = batch_digest(batch["input_ids"], batch["labels"])
            batch["step_digest"] = torch.tensor(digest_int64(digest), dtype=torch.int64)
        return batch

    def _consume(
        self, items: list[WorkerItem], batch: dict[str, torch.Tensor], k: int
    ) -> dict[str, torch.Tensor]:
        """Count batch ``k`` of the current items as consumed."""
        if self._feedback is not None:
            config = self.config
            if len(self._unrecorded) == _UNRECORDED:
                self._unrecorded.popleft()  # its loss never came: not counted
            datasets = token_datasets(items, k, config.batch_size, config.seq_length)
            self._unrecorded.append((self._consumed.steps, datasets))
        self._consumed.consume_batch(items, k)
        self._consumed.steps += 1
        # With a mix that follows the loss, a step's automatic checkpoint waits for its
        # loss (``record_loss``): the state then holds it, and a resume continues exactly.
        if self.checkpointer is not None and self._feedback is None:
            self.checkpointer.after_step(self)
        return batch

    def _pass_skipped(self, k: int, n_batches: int, generation: int) -> tuple[int, bool]:
        """Batch ``k`` of the current items moved past pending skipped batches, and whether
        the workers must restart instead (state loaded, or a skip reaching further than the
        current items and one more: fast-forwarding at span level is then cheaper)."""
        if self._generation != generation:
            return k, True
        if not self._pending_skip:  # the common case: no attribute of the loader is set
            return k, False
        passed = min(self._pending_skip, n_batches - k)
        self._pending_skip -= passed
        config = self.config
        most = item_batch_counts(config.batch_size, config.line_length, max(1, self.num_workers))
        restart = self._pending_skip > most[-1]
        return k + passed, restart

    def _next_items(self, feed: Any) -> tuple[list[Any], int]:
        """The next item of each worker. A worker killed by a signal (a SIGBUS when a
        mapped shard is cut short under it) becomes a ``ShardFormatError`` naming the file
        that changed, where one did (PyTorch's own message blames shared memory), else a
        ``WorkerDiedError`` naming the worker, its logical shards and the signal; one that
        sent nothing for ``worker_timeout`` seconds, a ``WorkerStalledError``
        (``fmsdata.loader.workerwait``).

        Raises:
            WorkerStalledError: A worker sent nothing for ``worker_timeout`` seconds.
            WorkerDiedError: A worker died.
            ShardFormatError: A worker died reading a file that changed under it.
        """
        if self.num_workers == 0:
            fault_note.start()  # a SIGBUS here prints the stack, naming the mapped files
        try:
            return feed.items()
        except RuntimeError as err:
            if isinstance(err, FmsDataError):
                raise
            pids = self.worker_pids()
            changed = changed_in_dead_workers(pids)
            if changed:
                raise ShardFormatError(
                    f"{'; '.join(changed)} (a DataLoader worker died reading it: {err})"
                ) from err
            parts = getattr(self._parts, "parts", None)
            dead = dead_workers(parts)
            if dead:
                assert self._pids is not None
                pids = self._pids.tolist()
                raise died_error(parts, dead, pids, self._worker_shards, err) from err
            raise

    def _worker_shards(self, worker: int) -> list[int]:
        """The logical shards DataLoader worker ``worker`` runs (as it deals them itself)."""
        dataset: RankLineDataset = self.dataset  # type: ignore[assignment]
        local = worker_shards(
            len(dataset.shard_ids), worker, self.num_workers, self.config.batch_size
        )
        return [dataset.shard_ids[i] for i in local]

    def _start_workers(self) -> tuple[Iterator[Any], BatchRing | None]:
        dataset: RankLineDataset = self.dataset  # type: ignore[assignment]
        config = self.config
        # One ring per live iteration: a second iteration started while another still
        # runs (both continue from the consumed position) gets a ring of its own.
        if (self._ring is None or self._ring.in_use) and dataset.preprocess is None:
            slots = ring_slots(
                config.batch_size, config.line_length, config.prefetch_factor, self.num_workers
            )
            self._ring = BatchRing(
                slots,
                self._fields,
                config.batch_size,
                config.seq_length,
                self.num_workers > 0,
                getattr(torch, config.output_dtype),
            )
        self._settle()
        self._pids = self._stacks = None
        if self.num_workers > 0:
            self._pids = torch.zeros(self.num_workers, dtype=torch.int64).share_memory_()
            self._stacks = torch.zeros(self.num_workers, dtype=torch.int64).share_memory_()
            if self._calls is None:
                shape = (self.num_workers, len(requests.FIELDS))
                self._calls = torch.zeros(shape, dtype=torch.int64).share_memory_()
        dataset.start_at(
            dataclasses.replace(
                self.start_position(),
                advance=self._consumed.workers_start(),
                ring=self._ring,
                first_batch=self._ring.position if self._ring is not None else 0,
                pids=self._pids,
                stacks=self._stacks,
                calls=self._calls,
            )
        )
        parts: Iterator[Any] = super().__iter__()
        if self._pids is not None and self._stacks is not None:
            shards = [self._worker_shards(w) for w in range(self.num_workers)]
            parts = WatchedItems(parts, config.worker_timeout, self._pids, self._stacks, shards)
        self._parts = parts
        return self._parts, self._ring

    def start_position(self) -> Start:
        """Where the next iteration starts, a loaded state's mix change applied: each of
        the rank's shards' state, the lines consumed past it (``advance``) and the lines
        consumed from each (``emitted``, where the row dealing continues). What
        ``fmsdata.trace`` replays a run from."""
        self._settle()
        consumed = self._consumed
        return Start(
            paths=consumed.paths,
            states=consumed.shard_states(),
            advance=consumed.advances(),
            emitted=consumed.emitted(),
        )

    @property
    def skips(self) -> list[list[int]]:
        """``[step, n]`` of every skip so far (the state's ``skips``): ``n`` batches passed
        over when the run had consumed ``step``."""
        return [list(skip) for skip in self._consumed.skips]

    def skip(self, n_steps: int) -> None:
        """Pass over the next ``n_steps`` batches of this rank without reading their tokens.

        The lines those batches would have held are consumed from their logical shards, so
        nothing of them is ever emitted; the skip is recorded in the state (``skips``) and,
        being per-shard positions, holds across resumes and rescales. Call it on every rank
        with the same ``n_steps``. Called inside a ``for batch in loader`` loop, the next
        batch is the one the run without the skip yields ``n_steps`` later: batches the
        workers already prepared are passed over, and a longer skip restarts the workers
        after it.
        """
        if n_steps < 0:
            raise ConfigError(f"skip needs a non-negative number of steps, got {n_steps}")
        if n_steps == 0:
            return
        dataset: RankLineDataset = self.dataset  # type: ignore[assignment]
        dealer = RowDealer(self._consumed.emitted())
        lines: collections.Counter[int] = collections.Counter()
        for _ in range(n_steps):
            for local in dealer.deal(self.config.batch_size):
                lines[dataset.shard_ids[local]] += 1
        self._consumed.skips.append([self._consumed.steps, n_steps])
        self._consumed.advance_by(lines)
        self._consumed.steps += n_steps
        # A running iteration passes over these batches: in place when its workers already
        # prepared them, else by restarting its workers after them.
        self._pending_skip += n_steps

    def _apply_configured_skips(self) -> None:
        """Skips from ``config.skip_steps`` whose step has come and that the state lacks."""
        if not self.config.skip_steps:
            return
        for n in due_skips(self.config.skip_steps, self._consumed.steps, self._consumed.skips):
            self.skip(n)

    # -- a mix that follows the loss ----------------------------------------------------

    def record_loss(self, batch: Any, loss: Any) -> None:
        """Report the training loss of a batch this rank was handed (``mix_policy``).

        Call it on every rank, every step, once per batch, in the order the batches came
        (it sums over ranks with ``torch.distributed`` when that is initialized). The
        loss is attributed to the datasets of the batch's tokens (a row holds parts of
        several documents): per token by each token's dataset, per sequence by each
        dataset's share of the row's tokens; every ``mix_update_every`` recorded steps
        the policy turns the means into new weights, which apply from the next batch
        this rank takes (the same step on every rank). Tokens whose label is ignored
        (``labels`` of the batch, where it has them) do not count. The automatic
        checkpoint of a step (``checkpoint_every``) is taken here, once its loss is in.

        Args:
            batch: The batch (its ``labels``, when it has them, mark ignored tokens).
            loss: Loss per input token ``[batch_size, seq_length]`` (0 where ignored) or
                per sequence ``[batch_size]``; a tensor (any device) or an array.

        Raises:
            ConfigError: No ``mix_policy``, no batch waiting for its loss, a loss of
                another shape or not finite, or a policy's bad output.
        """
        self._prepare()
        feedback = self._feedback
        if feedback is None:
            raise ConfigError("record_loss needs a mix that follows the loss: set mix_policy")
        if not self._unrecorded:
            raise ConfigError(
                "record_loss: every batch handed out has its loss recorded already (call it "
                "once per batch, after taking the batch)"
            )
        config = self.config
        values = check_loss(loss, config.batch_size, config.seq_length)
        _, datasets = self._unrecorded.popleft()
        if datasets is None:
            raise ConfigError("record_loss: the batch carries no dataset of its tokens")
        sums = attribute(datasets, values, counted_tokens(batch, datasets.shape), feedback.k)
        weights = feedback.add(*sums)
        if weights is not None:
            self._apply_weights(weights)
        if self.checkpointer is not None:
            self.checkpointer.after_step(self)

    @property
    def mix_history(self) -> list[tuple[int, list[float]]]:
        """The weights as applied, ``[(step, weights), ...]`` (normalized; each from its
        step on), over the whole run; empty without ``mix_policy`` (unless the run had
        one before a resume)."""
        self._prepare()
        record = self._feedback.record if self._feedback is not None else self._kept_mix
        return [] if record is None else [(step, list(w)) for step, w in record.history]

    @property
    def mix_update_due(self) -> int | None:
        """The last step whose batch is drawn with the weights in force now, whatever the
        losses still to come: the policy's next update (after ``mix_update_every``
        recorded steps, those of the current interval counted) applies from the batch
        after it at the earliest. None without ``mix_policy`` (the weights stay)."""
        self._prepare()
        if self._feedback is None:
            return None
        record = self._feedback.record
        return self._consumed.steps + record.setup["mix_update_every"] - record.records

    def _use_weights(self, weights: list[float]) -> None:
        """Draw with ``weights`` from the next chain built (the fingerprint records them)."""
        dataset: RankLineDataset = self.dataset  # type: ignore[assignment]
        names = dataset.mix_names if self.config.datasets is None else self.config.datasets
        self.config = self.config.replace(datasets=list(names), weights=list(weights))
        dataset.config = dataset.config.replace(datasets=list(names), weights=list(weights))

    def _apply_weights(self, weights: list[float]) -> None:
        """The policy's new weights, from the next batch on: the shards' chains are
        carried over at the consumed position as a mix change on resume is
        (``fmsdata.loader.resume``: lines already drawn are replayed with the old
        weights, every share measured afresh from here), and the workers restart."""
        assert self._feedback is not None
        saved = self._saved()  # with the weights its lines were drawn with
        entries = {entry.id: entry for entry in saved.shards}
        self._feedback.applied(self._consumed.steps, weights)
        self._use_weights(weights)
        self._mix_change = resume.MixChange(saved, entries, rebase=True)
        self._generation += 1

    def _load_feedback(self, saved: LoaderState) -> None:
        """The feedback mix a loaded state continues (``fmsdata.loader.feedback.resumed``),
        its weights drawn with from here."""
        dataset: RankLineDataset = self.dataset  # type: ignore[assignment]
        self._unrecorded.clear()
        self._feedback, self._kept_mix = resumed(
            saved.mix_feedback, self._configured_mix, dataset.mix_names, saved.steps
        )
        if self._feedback is not None:
            self._use_weights(self._feedback.weights)

    def remote_calls(self) -> dict[str, int]:
        """Calls to object storage so far by this process (every loader in it, and
        whatever else it reached through fmsdata) and by this loader's DataLoader workers,
        by kind, and the bytes read: ``{"LIST", "HEAD", "GET", "PUT", "DELETE", "OTHER",
        "bytes"}`` (``fmsdata.remote.requests`` says what a call is)."""
        total = requests.counts()
        if self._calls is not None:
            total = total + self._calls.numpy().sum(axis=0)
        return requests.as_dict(total)

    def worker_pids(self) -> list[int]:
        """Process ids of the workers of the current iteration (empty without workers; a
        worker not started yet is left out)."""
        return [pid for pid in self._pids.tolist() if pid] if self._pids is not None else []

    # -- state ---------------------------------------------------------------------------

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What a state must match to load here: data hash and stream-shaping config."""
        self._prepare()
        return _fingerprint_of(self.dataset)  # type: ignore[arg-type]

    @property
    def steps(self) -> int:
        """Batches consumed since the start of the run (carried through resumes)."""
        return self._consumed.steps

    def restart_step_count(self) -> None:
        """Count steps from 0 again, at the same data position.

        For a run that continues another run's data under its own step count (a new
        training stage): automatic checkpoints then fall on this run's steps.
        """
        self._consumed.steps = 0

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's state keyed by logical shard, each entry a uint8 tensor.

        The loader is a ``torch.distributed.checkpoint`` ``Stateful``: this is what DCP
        saves (tensors only, nothing pickled), and since the keys name logical shards, a
        DCP load on another world size brings each rank the shards it now owns (load with
        ``fmsdata.checkpoint.LoadPlanner()``, which sizes the entries from the checkpoint,
        and ``storage_reader=fmsdata.checkpoint.SafeFileSystemReader(path)``, with which
        loading the checkpoint runs nothing its files hold).
        ``snapshot()`` has the same content as nested plain data.
        """
        return self._saved().pack()

    def snapshot(self, settle: bool = False) -> dict[str, Any]:
        """This rank's state as plain nested data (ints, strings, lists, numpy arrays;
        the layout is ``fmsdata.state.format``'s).

        Each shard entry is a pipeline state plus ``advance``, the lines the shard emitted
        after it (at most a round of a worker's items, ``fmsdata.transport.rounds.item_rounds``:
        about a hundred lines a shard with 64 shards); a resume replays them.
        ``settle=True`` replays them here instead, reading document metadata, so every
        entry describes its shard exactly (``advance`` 0) — for inspection; resuming does
        not need it.
        """
        saved = self._saved()
        pending = {e.id: e for e in saved.shards if e.advance}
        if settle and pending:
            settled = resume.replay(self.dataset, pending)  # type: ignore[arg-type]
            saved.shards = [settled.get(e.id, e) for e in saved.shards]
        return saved.to_plain()

    def _saved(self) -> LoaderState:
        """What was consumed, as a ``LoaderState`` of this rank."""
        self._settle()
        dataset: RankLineDataset = self.dataset  # type: ignore[assignment]
        consumed = self._consumed
        advances = consumed.advances()
        return LoaderState(
            fingerprint=self.fingerprint,
            world_size=dataset.topology.world_size,
            steps=consumed.steps,
            skips=[list(skip) for skip in consumed.skips],
            span_datasets=[d.name for d in dataset.catalog().datasets],
            shards=[
                ShardEntry(sid, state, advances[sid])
                for sid, state in consumed.shard_states().items()
            ],
            rank=dataset.topology.rank,
            mix_feedback=self._feedback.record if self._feedback is not None else self._kept_mix,
        )

    def load_state_dict(self, state: Any, allow_changes: Sequence[str] = ()) -> None:
        """Resume from this rank's own state, or from the states of every rank of a save.

        States from a run with another world size rescale: each logical shard continues
        from its saved position, on whichever rank now owns it. Loading reads the state
        (``fmsdata.state.format``), checks its fingerprint, takes this rank's shards and
        records where the next iteration starts; an allowed mix change is recorded too
        and applied then. Each shard's chain is built and its state loaded where it runs,
        and there its stages check their own parts against the data, before any batch is
        yielded (a ``StateMismatchError`` naming the path inside the state and the value).

        A state saved with another ``seq_length`` loads with
        ``allow_changes=["seq_length"]`` (long-context extension mid-run): every document
        keeps its position and the lines the state holds are re-packed at the new length
        (``fmsdata.state.relength``, docs/guide/resume.md).

        Args:
            state: A ``state_dict()`` or ``snapshot()`` of this rank, a list of every
                rank's, or (packed form) the union of their dicts.
            allow_changes: Fingerprint fields or stage settings allowed to differ (an
                intended config change), e.g. ``["min_length"]``, or ``["seq_length"]``;
                added to the config's ``allow_changes``.

        Raises:
            StateMismatchError: Wrong version, different data or stream config, or the
                given states do not hold every shard this rank needs.
        """
        self._prepare()
        dataset: RankLineDataset = self.dataset  # type: ignore[assignment]
        saved = LoaderState.read(state, self.config.logical_shards)
        before = (self.config, dataset.config, self._feedback, self._kept_mix)
        try:
            # The weights a continued feedback mix applies now are part of what must match.
            self._load_feedback(saved)
            current = self.fingerprint
            allow = [*self.config.allow_changes, *allow_changes]
            entries = saved.for_shards(dataset.shard_ids, dataset.topology.rank)
            old_seq = seq_length_change(saved.fingerprint, current, allow)
            if old_seq is not None:
                # Checked against this loader at the saved length: whatever that length
                # derives (capacity, line_tokens, line_length) may differ, nothing else.
                old = resume.at_seq_length(dataset, old_seq)
                old.data_fingerprint = dataset.data_fingerprint
                current = _fingerprint_of(old)
                allow = [a for a in allow if a != SEQ_LENGTH]
            rebase = saved.check(current, allow, self.config.allow_mix_change)
            if old_seq is not None:
                resume.check_line_change(dataset, old)
        except BaseException:
            self.config, dataset.config, self._feedback, self._kept_mix = before
            raise
        self._consumed = ConsumedState(dataset.shard_ids, entries, saved.steps, saved.skips)
        dropped = sorted(set(saved.fingerprint["datasets"]) - set(dataset.mix_names))
        if dropped:
            logger.warning(
                "datasets %s are no longer in the mix; their positions are dropped", dropped
            )
        remix = rebase or saved.span_datasets != dataset.mix_names
        changed = remix or old_seq is not None
        self._mix_change = resume.MixChange(saved, entries, rebase, old_seq) if changed else None
        self._generation += 1

    def _settle(self) -> None:
        """Apply a loaded state's mix change, once (``fmsdata.loader.resume``)."""
        change, self._mix_change = self._mix_change, None
        if change is not None:
            dataset: RankLineDataset = self.dataset  # type: ignore[assignment]
            self._consumed = resume.settle(change, dataset, self._consumed)


def _fingerprint_of(dataset: RankLineDataset) -> dict[str, Any]:
    """What a state must match to load into a loader over ``dataset``."""
    names = dataset.mix_names
    data = {
        name: digest for name, digest in dataset.catalog().fingerprint().items() if name in names
    }
    stages, writer = dataset.layout()
    return stream_fingerprint(dataset.config, dataset.handler, names, data, stages, writer)


def due_skips(
    skip_steps: Sequence[Sequence[int]], steps: int, skips: Sequence[Sequence[int]]
) -> list[int]:
    """The skips of ``skip_steps`` (config ``[[step, n], ...]``) that a run at ``steps``
    with the recorded ``skips`` applies now, in order: each whose step has come and that the
    record lacks (one that applies moves ``steps`` on, so a later one may follow at once)."""
    due = []
    recorded = [list(skip) for skip in skips]
    for at, n in skip_steps:
        if steps == at and [at, n] not in recorded:
            due.append(int(n))
            recorded.append([steps, int(n)])
            steps += int(n)
    return due


def as_tuple(batch: dict[str, torch.Tensor]) -> Any:
    """A batch's tensors in its key order (``batch_format="tuple"``); one tensor alone."""
    values = tuple(batch.values())
    return values[0] if len(values) == 1 else values
