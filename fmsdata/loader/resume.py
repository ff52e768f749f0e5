"""A loaded state that was saved with another mix, carried over to this loader's.

A state saved with another dataset list, weights or schedule (``allow_mix_change``) is
loaded as it was saved and changed at the next iteration, once (``settle``): each
shard's lines emitted after its saved state (``advance``) are replayed at span level with
the mix they were drawn with, then every stage carries its own part over to the new
dataset list (``fmsdata.state.remix``). Datasets no longer mixed whose lines saved states
still hold stay readable until those lines are emitted (``RankLineDataset.drain``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from fmsdata.loader.consumed import ConsumedState
from fmsdata.state.fingerprint import MIX_FIELDS
from fmsdata.state.format import LoaderState, ShardEntry
from fmsdata.state.remix import remix
from fmsdata.worker.dataset import RankLineDataset

__all__ = ["MixChange", "replay", "settle"]


@dataclasses.dataclass(frozen=True)
class MixChange:
    """A loaded state saved with another dataset list, weights or schedule: its shard
    entries as loaded, applied at the next iteration (``settle``).

    Attributes:
        saved: The state as loaded.
        entries: This rank's shard entries of it.
        rebase: The weights or schedule changed: every share is measured afresh.
    """

    saved: LoaderState
    entries: Mapping[int, ShardEntry]
    rebase: bool


def settle(change: MixChange, dataset: RankLineDataset, consumed: ConsumedState) -> ConsumedState:
    """What ``consumed`` (loaded from ``change``, and skipped past since) is, carried over
    to ``dataset``'s mix."""
    saved, rebase = change.saved, change.rebase
    entries = dict(change.entries)
    pending = {sid: e for sid, e in entries.items() if e.state is not None and e.advance}
    if rebase and pending:
        entries.update(replay(_as_saved(saved, dataset), pending))
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


def _as_saved(saved: LoaderState, dataset: RankLineDataset) -> RankLineDataset:
    """``dataset`` as configured when ``saved`` was taken (its dataset list, weights and
    schedule), for replaying the lines drawn with that mix."""
    fingerprint = saved.fingerprint
    old = dataset.config.replace(
        **{field: fingerprint[field] for field in MIX_FIELDS},
        allow_mix_change=False,
        checkpoint_dir=None,
        checkpoint_every=0,
    )
    mixed = RankLineDataset(old, dataset.topology, stages=dataset.stages)
    mixed.drain([n for n in saved.span_datasets if n not in fingerprint["datasets"]])
    return mixed


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
