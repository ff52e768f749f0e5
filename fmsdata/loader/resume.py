"""A loaded state that was saved with another mix or line length, carried over to this
loader's.

A state saved with another dataset list, weights or schedule (``allow_mix_change``), or
another ``seq_length`` (``allow_changes=["seq_length"]``), is loaded as it was saved and
changed at the next iteration, once (``settle``): each shard's lines emitted after its
saved state (``advance``) are replayed at span level with the config they were made with,
then the lines the states hold are re-packed at the new length (``fmsdata.state.relength``)
and every stage carries its own part over to the new dataset list
(``fmsdata.state.remix``). Datasets no longer mixed whose lines saved states still hold
stay readable until those lines are emitted (``RankLineDataset.drain``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fmsdata.errors import StateMismatchError
from fmsdata.loader.consumed import ConsumedState
from fmsdata.stages.base import walk
from fmsdata.stages.savedlines import DocumentLengths
from fmsdata.state.fingerprint import MIX_FIELDS
from fmsdata.state.format import LoaderState, ShardEntry
from fmsdata.state.relength import relength
from fmsdata.state.remix import remix
from fmsdata.worker.dataset import RankLineDataset

__all__ = ["MixChange", "replay", "settle", "at_seq_length", "check_line_change"]


@dataclasses.dataclass(frozen=True)
class MixChange:
    """A loaded state saved with another dataset list, weights or schedule, or another
    ``seq_length``: its shard entries as loaded, applied at the next iteration (``settle``).

    Attributes:
        saved: The state as loaded.
        entries: This rank's shard entries of it.
        rebase: The weights or schedule changed: every share is measured afresh.
        seq_length: The ``seq_length`` the state was saved with, where this loader's
            differs (None: the same).
    """

    saved: LoaderState
    entries: Mapping[int, ShardEntry]
    rebase: bool
    seq_length: int | None = None


def settle(change: MixChange, dataset: RankLineDataset, consumed: ConsumedState) -> ConsumedState:
    """What ``consumed`` (loaded from ``change``, and skipped past since) is, carried over
    to ``dataset``'s mix."""
    saved, rebase, old_seq = change.saved, change.rebase, change.seq_length
    entries = dict(change.entries)
    # Lines emitted after a state (or after the start, state None) were made with the saved
    # config: replayed with it.
    pending = {sid: e for sid, e in entries.items() if e.advance}
    if (rebase or old_seq is not None) and pending:
        entries.update(replay(_as_saved(saved, dataset, old_seq), pending))
    if old_seq is not None:
        entries = _relength(entries, saved, dataset, old_seq)
    mix = dataset.mix_names
    entries, space = remix(entries, saved.fingerprint["stages"], mix, saved.span_datasets, rebase)
    dataset.drain(space[len(mix) :])
    advances = consumed.advances()  # lines skipped since the load come after the replay
    entries = {
        sid: dataclasses.replace(
            entry, advance=advances[sid] - (change.entries[sid].advance - entry.advance)
        )
        for sid, entry in entries.items()
    }
    return ConsumedState(dataset.shard_ids, entries, consumed.steps, consumed.skips)


def _as_saved(
    saved: LoaderState, dataset: RankLineDataset, seq_length: int | None = None
) -> RankLineDataset:
    """``dataset`` as configured when ``saved`` was taken (its dataset list, weights and
    schedule, and ``seq_length`` when given), for replaying the lines made with them."""
    fingerprint = saved.fingerprint
    mixed = at_seq_length(
        dataset, seq_length, **{field: fingerprint[field] for field in MIX_FIELDS}
    )
    mixed.drain([n for n in saved.span_datasets if n not in fingerprint["datasets"]])
    return mixed


def at_seq_length(
    dataset: RankLineDataset, seq_length: int | None, **fields: Any
) -> RankLineDataset:
    """``dataset`` with another ``seq_length`` (None: its own) and config ``fields``, for
    the chain a state was saved with; it loads and saves nothing by itself."""
    if seq_length is not None:
        fields["seq_length"] = seq_length
    config = dataset.config.replace(
        **fields, allow_mix_change=False, checkpoint_dir=None, checkpoint_every=0
    )
    return RankLineDataset(config, dataset.topology, stages=dataset.stages)


def _relength(
    entries: Mapping[int, ShardEntry], saved: LoaderState, dataset: RankLineDataset, old_seq: int
) -> dict[int, ShardEntry]:
    """Settled entries saved at ``old_seq`` carried over to ``dataset``'s ``seq_length``
    (``fmsdata.state.relength``), spans measured in the saved dataset numbering."""
    context = _as_saved(saved, dataset, old_seq).shard_context(1)
    try:
        documents = DocumentLengths(context.accesses, context.recipe.decoration)
        settings = {tuple(s["path"]): s["settings"] for s in dataset.layout()[0]}
        return relength(
            entries,
            saved.fingerprint["stages"],
            settings,
            documents,
            old_seq,
            dataset.config.seq_length,
        )
    finally:
        context.close()


def check_line_change(dataset: RankLineDataset, old: RankLineDataset) -> None:
    """Refuse a ``seq_length`` change (``old`` at the saved length, ``dataset`` at the new
    one) that cannot keep every document's position: one that makes a small dataset
    rotate, or stop rotating (docs/guide/document-order.md: its documents are then dealt
    to the logical shards otherwise), or a weight schedule in steps (a step's tokens
    change with the length, so the steps taken would map to other points of it).

    Raises:
        StateMismatchError: Saying why, and that a new run is needed.
    """
    before, after = old.config.seq_length, dataset.config.seq_length
    cannot = (
        f"this run cannot continue at seq_length={after} (saved with seq_length={before}): "
        "start a new run, or resume with seq_length="
        f"{before}"
    )
    mix = dataset.config.mix
    if mix.weight_schedule is not None and mix.schedule_unit == "steps":
        raise StateMismatchError(
            "the weight schedule is in steps (schedule_unit: steps), which the mixer counts "
            "as global_batch_size lines of seq_length + 1 tokens: at another seq_length the "
            f"steps taken would map to other points of the schedule; {cannot} (a schedule in "
            "tokens, schedule_unit: tokens, keeps its points)"
        )
    sid = dataset.shard_ids[0] if dataset.shard_ids else 0
    found = []
    for each in (old, dataset):
        context = each.shard_context(1)
        try:
            pipeline = context.open(sid, each.stages)
            found.append(
                {
                    path: bool(getattr(stage, "rotating", False))
                    for path, stage in walk(pipeline.top)
                    if stage.role == "dataset" and getattr(stage, "size", 0) >= 0
                }
            )
        finally:
            context.close()
    for path in sorted(found[0].keys() & found[1].keys()):
        if found[0][path] != found[1][path]:
            name = path[-1] if path else "?"
            raise StateMismatchError(
                f"dataset {name!r} holds fewer tokens than logical_shards lines at one of "
                f"seq_length={before} and {after} but not at the other, so its documents are "
                "dealt to the logical shards otherwise at the new length (small datasets "
                f"rotate, docs/guide/document-order.md) and their positions cannot be kept; "
                f"{cannot}"
            )


def replay(dataset: RankLineDataset, pending: Mapping[int, ShardEntry]) -> dict[int, ShardEntry]:
    """Each pending shard's entry with the lines emitted after its state replayed on
    ``dataset``'s chain (``advance`` 0)."""
    context = dataset.shard_context(len(pending))
    out = {}
    try:
        writer = dataset.line_writer(context)
        for sid, entry in pending.items():
            pipeline = context.open(
                sid, dataset.stages, state=entry.state, advance=entry.advance, writer=writer
            )
            out[sid] = dataclasses.replace(entry, state=pipeline.state_dict(), advance=0)
    finally:
        context.close()
    return out
