"""``fmsdata state diff A B``: what changed between two saved loader states.

Both are read as ``fmsdata state show`` reads them (``read_states``, ``summarize``: each
stage reports its own part) and compared: steps and world size, the skips added, the mix
(datasets, weights, schedule), the data (a dataset whose files changed) and the seed,
per dataset the documents and tokens delivered, buffered, held and dropped, and epochs,
and the logical shards whose walk of a dataset entered another epoch.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import Any

from fmsdata.cli.parser import PathArg, add_command
from fmsdata.cli.storage_options import add_storage_options, storage_from_args

__all__ = ["add_diff_parser", "run_diff", "diff_states"]

# Per dataset, the counts compared (``summarize``'s names).
_COUNTS = (
    "docs",
    "tokens",
    "buffered_docs",
    "buffered_tokens",
    "unsent_tokens",
    "held_tokens",
    "dropped_docs",
    "dropped_tokens",
    "skipped_docs",
)
# Fingerprint fields whose change the diff names (the mix, the keys of every order).
_SETTINGS = (
    "datasets",
    "weights",
    "weight_schedule",
    "schedule_unit",
    "global_batch_size",
    "seed",
    "logical_shards",
)
DIFF_HELP = "what changed between two saved states"
DIFF_DESCRIPTION = (
    "Compare two saved loader states (A before B, as state show reads each): steps, "
    "world size, skips added, the mix and the data, and per dataset the documents "
    "and tokens delivered, buffered, held and dropped, the epochs, and the logical "
    "shards that entered another epoch."
)


def add_diff_parser(actions: argparse._SubParsersAction) -> None:
    """``fmsdata state diff A B`` among the actions of ``fmsdata state``."""
    diff = add_command(actions, "diff", run_diff, DIFF_HELP, DIFF_DESCRIPTION)
    for name in ("a", "b"):
        diff.add_argument(
            name,
            type=PathArg("read"),
            metavar=name.upper(),
            help="a state as state show takes it (checkpoint folder, state file, DCP folder)",
        )
    diff.add_argument("--json", action="store_true", help="print the differences as JSON")
    diff.add_argument(
        "--config",
        type=PathArg("local"),
        help="the run's loader config (YAML): replay the lines each state's shards emitted "
        "after their recorded state, so both sides' counts are exact (as state show --config)",
    )
    diff.add_argument(
        "--stages",
        metavar="MODULE:FUNCTION",
        help="with --config, the run's chain of stages when it is not the default",
    )
    add_storage_options(diff)


def diff_states(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The differences between two saved states (every rank's of each)."""
    from fmsdata.cli.state import summarize
    from fmsdata.state.format import LoaderState

    first, second = summarize([dict(s) for s in a]), summarize([dict(s) for s in b])
    prints = [LoaderState.from_plain(states[0]).fingerprint for states in (a, b)]
    settings = {
        field: {"a": prints[0].get(field), "b": prints[1].get(field)}
        for field in _SETTINGS
        if prints[0].get(field) != prints[1].get(field)
    }
    data_a, data_b = prints[0].get("data") or {}, prints[1].get("data") or {}
    changed_data = sorted(n for n in set(data_a) & set(data_b) if data_a[n] != data_b[n])
    added = [s for s in second["skips"] if s not in first["skips"]]
    names = list(dict.fromkeys([*first["datasets"], *second["datasets"]]))
    datasets = {}
    for name in names:
        before = first["datasets"].get(name)
        after = second["datasets"].get(name)
        row: dict[str, Any] = {"in": [x is not None for x in (before, after)]}
        for key in _COUNTS:
            row[key] = _moved((before or {}).get(key, 0) or 0, (after or {}).get(key, 0) or 0)
        row["epochs_done"] = {
            "a": (before or {}).get("epochs_done"),
            "b": (after or {}).get("epochs_done"),
        }
        row["new_epoch_shards"] = _new_epochs(first["shards"], second["shards"], name)
        datasets[name] = row
    return {
        "steps": _moved(first["steps"], second["steps"]),
        "world_size": {"a": first["world_size"], "b": second["world_size"]},
        "skips_added": added,
        "settings": settings,
        "data_changed": changed_data,
        "datasets": datasets,
        "stage_counts": _count_changes(first["stage_counts"], second["stage_counts"]),
        "left_out": [s["left_out"] for s in (first, second) if s["left_out"]],
    }


def _moved(a: int, b: int) -> dict[str, int]:
    return {"a": a, "b": b, "change": b - a}


def _new_epochs(
    a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], name: str
) -> list[int]:
    """Logical shards whose walk of dataset ``name`` is in a later epoch in ``b``."""
    before = {row["id"]: row["datasets"].get(name) for row in a}
    out = []
    for row in b:
        now, then = row["datasets"].get(name), before.get(row["id"])
        if now is not None and then is not None and now["epoch"] > then["epoch"]:
            out.append(int(row["id"]))
    return out


def _count_changes(
    a: Mapping[str, Mapping[str, int]], b: Mapping[str, Mapping[str, int]]
) -> dict[str, dict[str, int]]:
    out = {}
    for stage in dict.fromkeys([*a, *b]):
        keys = dict.fromkeys([*(a.get(stage) or {}), *(b.get(stage) or {})])
        changes = {k: (b.get(stage) or {}).get(k, 0) - (a.get(stage) or {}).get(k, 0) for k in keys}
        if any(changes.values()):
            out[stage] = changes
    return out


def run_diff(args: argparse.Namespace) -> int:
    from fmsdata.cli.state import read_states, settle_states
    from fmsdata.errors import ConfigError

    if args.stages and not args.config:
        raise ConfigError("--stages names the run's chain for --config: pass both")
    storage = storage_from_args(args)
    where_a, a = read_states(args.a, storage)
    where_b, b = read_states(args.b, storage)
    if args.config:
        a = settle_states(a, args.config, args.stages)
        b = settle_states(b, args.config, args.stages)
    diff = diff_states(a, b)
    if args.json:
        print(json.dumps({"a": where_a, "b": where_b, **diff}, indent=2))
        return 0
    steps = diff["steps"]
    print(f"A: {where_a}\nB: {where_b}")
    print(f"steps: {steps['a']:,} -> {steps['b']:,} ({steps['change']:+,})")
    sizes = diff["world_size"]
    if sizes["a"] != sizes["b"]:
        print(f"world size: {sizes['a']} -> {sizes['b']}")
    for at, n in diff["skips_added"]:
        print(f"skip added: {n} step(s) at step {at}")
    for field, change in diff["settings"].items():
        print(f"{field}: {change['a']} -> {change['b']}")
    for name in diff["data_changed"]:
        print(f"data changed: the files of dataset {name!r} differ")
    print(
        f"\n{'dataset':16} {'delivered docs':>22} {'tokens':>26} {'buffered tokens':>18} "
        f"{'dropped tokens':>16} {'epochs done':>15}"
    )
    for name, row in diff["datasets"].items():
        epochs = row["epochs_done"]
        shown = " -> ".join("-" if e is None else f"{e:.3f}" for e in (epochs["a"], epochs["b"]))
        print(
            f"{name:16} {_change(row['docs']):>22} {_change(row['tokens']):>26} "
            f"{row['buffered_tokens']['change']:>+18,} {row['dropped_tokens']['change']:>+16,} "
            f"{shown:>15}"
        )
        if row["new_epoch_shards"]:
            print(f"{'':16} logical shard(s) in a new epoch: {row['new_epoch_shards']}")
        if row["in"] != [True, True]:
            print(f"{'':16} " + ("added in B" if not row["in"][0] else "not in B"))
    for stage, changes in diff["stage_counts"].items():
        print(f"\n{stage}: " + ", ".join(f"{k} {v:+,}" for k, v in changes.items()))
    for note in diff["left_out"]:
        print(f"\nnote: {note}")
    return 0


def _change(value: Mapping[str, int]) -> str:
    return f"{value['b']:,} ({value['change']:+,})"
