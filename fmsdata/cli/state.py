"""``fmsdata state show DIR``: what a saved loader state holds, without writing code.

``SHOW_DESCRIPTION`` (its ``--help``) says which folders and files it reads, and how
without unpickling anything that could build arbitrary objects.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fmsdata.cli.parser import PathArg, add_command
from fmsdata.cli.storage_options import add_storage_options, storage_from_args
from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.util.urls import is_url, local_path, location, url_scheme

if TYPE_CHECKING:
    from fmsdata.remote.storage import Storage

SHOW_DESCRIPTION = (
    "Print what a saved loader state holds: per dataset and per logical shard, the epoch, "
    "the position in it, the documents and tokens delivered (lines still in the shuffle "
    "buffer and the unsent rest of split documents apart), and the skips. PATH is a loader "
    "checkpoint folder (loader_rank_*.fms files), a folder of automatic checkpoints (the "
    "newest complete step_* folder is read), a single state file, a "
    "torch.distributed.checkpoint folder holding a loader entry, or a folder of such DCP "
    "step_<N> folders (the newest is read). Nothing is unpickled that "
    "could build arbitrary objects: DCP's .metadata goes through an allow-list of DCP's own "
    "metadata classes, tensors through torch.load(weights_only=True), the rest is JSON."
)
SHOW_HELP = "epochs, documents and tokens seen per dataset and logical shard"
# A logical shard's figures per dataset in the summary, from the names its report gives.
_SHARD_FIELDS = [
    (key, {"docs": "delivered_docs", "tokens": "delivered_tokens"}.get(key, key))
    for key in "epoch pos size docs skipped tokens buffered_docs buffered_tokens unsent_tokens "
    "held_tokens dropped_docs dropped_tokens".split()
]


def add_show_parser(actions: argparse._SubParsersAction) -> None:
    """``fmsdata state show PATH`` among the actions of ``fmsdata state``."""
    show = add_command(actions, "show", run_show, SHOW_HELP, SHOW_DESCRIPTION)
    show.add_argument(
        "path",
        type=PathArg("read"),
        help="checkpoint folder (local or a URL such as s3://bucket/ckpts), DCP checkpoint "
        "folder (local) or state file",
    )
    show.add_argument("--json", action="store_true", help="print the summary as JSON")
    show.add_argument(
        "--plot",
        metavar="FILE.png",
        type=PathArg("local"),
        help="also draw, per dataset, how far each logical shard has read and the token "
        'shares delivered against the weights (needs matplotlib: pip install "fmsdata[plot]")',
    )
    show.add_argument(
        "--config",
        type=PathArg("local"),
        help="the run's loader config (YAML): replay the lines emitted after each shard's "
        "recorded state, reading the data, so delivered counts are exact",
    )
    show.add_argument(
        "--stages",
        metavar="MODULE:FUNCTION",
        help="with --config, the run's chain of stages when it is not the default: the "
        "function passed as build_dataloader(stages=...), imported from MODULE (a module "
        "name, found from the current folder too)",
    )
    add_storage_options(show)


@dataclasses.dataclass(frozen=True)
class FoundStates:
    """Loader states found at a path: where exactly (a file or folder), every rank's
    snapshot, and what held them when it was not fmsdata's own file (a trainer's
    checkpoint entry, a DCP entry), else None."""

    where: str
    states: list[dict[str, Any]]
    source: str | None = None


def read_states(path: str, storage: Storage | None = None) -> tuple[str, list[dict[str, Any]]]:
    """(where the states were found, every rank's snapshot) for any supported ``path``: a
    local path or a URL (``storage`` says how to reach it); DCP and trainer checkpoint
    folders only locally."""
    found = find_states(path, storage)
    return found.where, found.states


def find_states(path: str, storage: Storage | None = None) -> FoundStates:
    """The loader states at ``path``: a state file, a loader checkpoint folder, a folder of
    automatic checkpoints, a DCP folder, or a trainer's checkpoint (torchtitan, OLMo-core,
    Lightning: ``fmsdata.integrations.checkpoints``), each read without running anything.

    Raises:
        StateMismatchError: Nothing readable there, saying what was found instead.
    """
    from fmsdata.checkpoint import latest_checkpoint, read_checkpoint
    from fmsdata.integrations.checkpoints import dcp_loader_state, trainer_checkpoint_state
    from fmsdata.remote.folder import Folder
    from fmsdata.state.checkpointsave import state_names

    local = not is_url(path) or url_scheme(path) == "file"
    here = Folder(location(path, "PATH"), storage)
    if here.is_file():
        return _file_states(path, here, local)
    names = here.names()
    if not names:
        raise StateMismatchError(f"{path}: no such file or folder")
    if ".metadata" in names:
        return _unpacked(dcp_loader_state(_local_dcp(path)))
    if state_names(names):
        return FoundStates(path, read_checkpoint(path, storage=storage))
    latest = latest_checkpoint(path, storage=storage)
    if latest is not None:
        return FoundStates(latest, read_checkpoint(latest, storage=storage))
    if local:
        found = trainer_checkpoint_state(local_path(path, "PATH"))
        if found is not None:
            return _unpacked(found)
    raise StateMismatchError(
        f"{path}: no loader state (loader_rank_*.fms, a complete step_*/ folder of them, "
        "or, in a local folder, a torch.distributed.checkpoint, a torchtitan step-<N>/, an "
        "OLMo-core step<N>/ or a Lightning .ckpt, or a folder of their step folders)"
    )


def _file_states(path: str, here: Any, local: bool) -> FoundStates:
    """A single file: fmsdata's state file, or a trainer's ``torch.save`` checkpoint (a
    Lightning ``.ckpt``, an OLMo-core ``rank<r>.pt``); a local one is read in place (only
    its pickle, not the tensors)."""
    import io

    from fmsdata.integrations.checkpoints import torch_save_loader_state
    from fmsdata.state.file import state_from_bytes
    from fmsdata.state.torchsave_read import is_torch_save

    with open(local_path(path, "PATH"), "rb") if local else io.BytesIO(here.read()) as stream:
        if is_torch_save(stream):
            return _unpacked(torch_save_loader_state(stream, path))
        return FoundStates(path, [state_from_bytes(stream.read(), path)])


def _unpacked(found: Any) -> FoundStates:
    """A ``TrainerState``'s packed union as one plain state."""
    from fmsdata.state.format import LoaderState

    states = [LoaderState.unpack(found.packed).to_plain()]
    return FoundStates(found.where, states, found.source)


def _local_dcp(path: str) -> str:
    """A DCP folder's local path; one in object storage is refused by name."""
    return local_path(
        path,
        "PATH",
        "torch.distributed.checkpoint folders are read from local disk: copy the folder "
        "first (fmsdata download URL DIR)",
    )


def summarize(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per dataset and per logical shard: epoch, position, documents, tokens, skips; what
    was delivered, and what each stage counts, as the stages report them
    (``fmsdata.state.report``). ``left_out`` says what the counts leave out (lines emitted after
    a shard's recorded state, stages this process cannot ask), None when they are exact."""
    from fmsdata.stages.savedchain import stage_types
    from fmsdata.state.format import LoaderState, mix_history_of
    from fmsdata.state.report import DELIVERY_KEYS, shard_report

    # Through the one reader of the format: checked, and an older version read as today's.
    read = [LoaderState.from_plain(state) for state in states]
    history = mix_history_of(read[0]) if read else []
    states = [state.to_plain() for state in read]
    first = states[0]
    fingerprint = first["fingerprint"]
    names = list(fingerprint["datasets"])
    types = stage_types()
    shards = []
    totals: dict[str, dict[str, float]] = {
        name: {"skipped": 0, "passes": 0.0, "size": 0, **dict.fromkeys(DELIVERY_KEYS, 0)}
        for name in names
    }
    stage_counts: dict[str, dict[str, int]] = {}
    ratios: dict[str, dict[str, tuple[str, str]]] = {}
    unknown: set[str] = set()
    lines = pending = 0
    for state in states:
        for entry in sorted(state["shards"], key=lambda e: e["id"]):
            row: dict[str, Any] = {
                "id": int(entry["id"]),
                "advance": int(entry["advance"]),
                "datasets": {},
            }
            pending += row["advance"]
            emitted = int(entry["state"]["emitted"]) if entry["state"] is not None else 0
            lines += row["advance"] + emitted
            report = shard_report(entry["state"], fingerprint, state["span_datasets"], types)
            unknown.update(report.unknown)
            for label, counts in report.counts.items():
                total_counts = stage_counts.setdefault(label, {})
                for key, value in counts.items():
                    total_counts[key] = total_counts.get(key, 0) + value
            for label, asked in report.ratios.items():
                ratios.setdefault(label, {}).update(asked)
            for name in names:
                got = report.datasets[name]
                size = got["size"]
                info: dict[str, Any] = {key: got[field] for key, field in _SHARD_FIELDS}
                info["epochs_done"] = info["epoch"] + info["pos"] / size if size > 0 else None
                row["datasets"][name] = info
                total = totals[name]
                total["skipped"] += got["skipped"]
                for key in DELIVERY_KEYS:
                    total[key] += got[key]
                if size > 0:
                    total["passes"] += info["epoch"] * size + info["pos"]
                    total["size"] += size
            shards.append(row)
    datasets = {
        name: {
            "docs": t["delivered_docs"],
            "tokens": t["delivered_tokens"],
            **{key: t[key] for key in DELIVERY_KEYS},
            "skipped_docs": t["skipped"],
            "epochs_done": t["passes"] / t["size"] if t["size"] else None,
        }
        for name, t in totals.items()
    }
    batch = fingerprint.get("global_batch_size")
    skipped_steps = sum(int(n) for _, n in first["skips"])
    return {
        "stage_counts": stage_counts,
        "stage_ratios": {
            label: {name: _ratio(stage_counts.get(label, {}), *two) for name, two in asked.items()}
            for label, asked in ratios.items()
        },
        "version": first["version"],
        "world_size": first["world_size"],
        "steps": first["steps"],
        "skips": first["skips"],
        "skipped_lines": skipped_steps * (lines // first["steps"]) if first["steps"] else 0,
        "logical_shards": fingerprint["logical_shards"],
        "weights": fingerprint.get("weights"),
        "weight_schedule": fingerprint.get("weight_schedule"),
        "mix_policy": fingerprint.get("mix_policy"),
        "mix_history": [[step, weights] for step, weights in history],
        "global_batch_size": batch,
        "lines": lines,
        "uncounted_lines": pending,
        "unknown_stages": sorted(unknown),
        "left_out": _left_out(pending, lines, sorted(unknown)),
        "datasets": datasets,
        "shards": shards,
    }


def _ratio(counts: dict[str, int], top: str, bottom: str) -> float | None:
    """``counts[top] / counts[bottom]`` (None when the denominator is 0 or missing)."""
    denominator = counts.get(bottom, 0)
    return counts.get(top, 0) / denominator if denominator else None


def _left_out(pending: int, lines: int, unknown: Sequence[str]) -> str | None:
    """What the token and document counts leave out, in words (None: nothing)."""
    said = []
    if pending:
        said.append(
            f"{pending:,} of {lines:,} lines delivered were emitted after their shard's "
            "recorded state and are not in the token and document counts (pass --config "
            "with the run's loader config, and --stages MODULE:FUNCTION if it built its own "
            "chain, to count them)"
        )
    if unknown:
        said.append(
            "what these stages hold is not subtracted (types this process has not "
            f"imported): {', '.join(unknown)}"
        )
    return "; ".join(said) or None


def stage_factory(spec: str) -> Any:
    """The chain factory ``MODULE:FUNCTION`` names (``--stages``), imported by the name the
    user gave (the current folder is searched too, as for ``python -m``)."""
    module_name, _, function = spec.partition(":")
    if not module_name or not function:
        raise ConfigError(f"--stages takes MODULE:FUNCTION, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(f"--stages {spec}: cannot import {module_name!r} ({error})") from None
    factory = getattr(module, function, None)
    if not callable(factory):
        raise ConfigError(f"--stages {spec}: {module_name} has no function {function!r}")
    return factory


def settle_states(
    states: Sequence[dict[str, Any]], config: str, stages: str | None = None
) -> list[dict[str, Any]]:
    """The states loaded into a one-rank loader over ``config`` (and the chain ``stages``
    names, default the config's) and settled: the lines emitted after each shard's
    recorded state are replayed (reading document lengths from the data), so every count
    is exact."""
    from fmsdata.loader import build_dataloader

    factory = stage_factory(stages) if stages else None
    loader = build_dataloader(config, rank=0, world_size=1, stages=factory)
    loader.load_state_dict(list(states))
    return [loader.snapshot(settle=True)]


def print_mix_history(policy: str | None, history: Sequence[Sequence[Any]], most: int = 24) -> None:
    """The weights as applied over the run (a mix that followed the loss), one line per
    change; past ``most`` changes, evenly picked ones and the last."""
    print(
        f"mix: weights followed the training loss (mix_policy {policy!r}), "
        f"{len(history) - 1} update(s):"
        if policy is not None
        else "mix: weights followed the training loss before a resume without mix_policy:"
    )
    picked: list[int] = list(range(len(history)))
    if len(history) > most:
        step = (len(history) - 1) / (most - 1)
        picked = sorted({round(i * step) for i in range(most)})
    for i in picked:
        at, weights = history[i]
        print(f"  from step {at:>8,}: " + "  ".join(f"{w:.4f}" for w in weights))
    if len(picked) < len(history):
        print(f"  ({len(history) - len(picked)} more in --json)")


def print_tables(summary: dict[str, Any]) -> None:
    """The per-dataset and per-logical-shard tables (``fmsdata.cli.statetable``)."""
    from fmsdata.cli.statetable import dataset_table, shard_table

    print("\nper dataset:")
    print("\n".join(dataset_table(summary["datasets"])))
    print("\nper logical shard:")
    print("\n".join(shard_table(summary["shards"])))


def run_show(args: argparse.Namespace) -> int:
    if args.plot is not None:
        from fmsdata.cli.plots import check_plot_target, plot_state

        check_plot_target(args.plot)
    found = find_states(args.path, storage_from_args(args))
    where, states = found.where, found.states
    saved_version = states[0].get("version") if states and isinstance(states[0], dict) else None
    if args.stages and not args.config:
        raise ConfigError("--stages names the run's chain for --config: pass both")
    if args.config:
        states = settle_states(states, args.config, args.stages)
    summary = summarize(states)
    summary["saved_version"] = saved_version
    if args.plot is not None:
        plot_state(summary, args.plot, title=f"loader state: {where}")
    if args.json:
        print(json.dumps({"path": where, "source": found.source, **summary}, indent=2))
        return 0
    print(f"loader state: {where}" + (f" ({found.source})" if found.source else ""))
    print(
        f"format version {summary['saved_version']}"
        + (
            f" (read as {summary['version']})"
            if summary["saved_version"] != summary["version"]
            else ""
        )
        + f", saved by {summary['world_size']} rank(s) at step "
        f"{summary['steps']}, {summary['logical_shards']} logical shards"
    )
    if summary["skips"]:
        print("skips: " + ", ".join(f"{n} steps at step {at}" for at, n in summary["skips"]))
    mix = summary["weight_schedule"] or summary["weights"]
    if summary["mix_history"]:
        print_mix_history(summary["mix_policy"], summary["mix_history"])
    else:
        print(f"mix: {mix if mix is not None else 'equal weights'}")
    skipped = (
        f", {summary['skipped_lines']:,} of them in skipped steps (passed over, not trained "
        "on; their documents and tokens are in the counts below)"
        if summary["skipped_lines"]
        else ""
    )
    print(f"lines delivered: {summary['lines']:,} (= steps x global batch size{skipped})")
    if summary["left_out"]:
        print(f"note: {summary['left_out']}")
    else:
        print("the counts below are exact: every line delivered is in them")
    print_tables(summary)
    for name, counts in summary["stage_counts"].items():
        shown = [f"{key} {value:,}" for key, value in counts.items()]
        shown += [
            f"{key} {'-' if value is None else f'{value:.4g}'}"
            for key, value in summary["stage_ratios"].get(name, {}).items()
        ]
        print(f"\n{name}: " + ", ".join(shown))
    if args.plot is not None:
        print(f"\nplot written to {args.plot}")
    return 0
