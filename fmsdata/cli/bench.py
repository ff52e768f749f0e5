"""``fmsdata bench CONFIG``: time to first batch, steady throughput and state cost of a loader.

What a training job sees after its first minute is the steady state: every shuffle buffer
full (while a buffer fills, it reads two lines for each one it hands out, see
``fmsdata.stages.shuffle``), the DataLoader workers started and their batch ring primed.
So the batches before that are not timed: the warm-up is the batches that fill this
rank's shuffle buffers (``shuffle_window`` lines in each logical shard it owns) plus
``--warmup`` more; the timed window then runs for at least ``--batches`` batches and at
least ``--seconds`` (a window of a few milliseconds would time the batches the workers had
queued during the warm-up, not the rate they make them at). The report says what was
timed. ``--workers 0,1,2`` measures each worker count in turn on a fresh loader. After the
window it prints what the stages count in the loader's state (as ``fmsdata state show``
does): with ``packing: best_fit``, the padding fraction, the documents cut (only those
longer than a line) and the mean documents per line of the lines packed so far.

Kernels are compiled on their first call here (``FMSDATA_COMPILE=foreground``, in the
DataLoader workers too), not in the background while their calls run as Python as in a
training process (``fmsdata.util.compiled``): with an empty cache the timed window would
otherwise hold batches made in Python. So the first batch includes compiling what is not
yet in numba's cache.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from fmsdata.cli.parser import PathArg, add_command, int_list, non_negative_int, positive_int

if TYPE_CHECKING:
    from fmsdata.loader import FmsDataLoader
    from fmsdata.worker.dataset import RankLineDataset

__all__ = [
    "add_parser",
    "run",
    "measure",
    "stage_figures",
    "fill_batches",
    "tokens_per_second",
]

# Worker counts whose rates differ by less than this are not ranked against each other.
TIE = 0.05
HELP = "measure a loader config: first batch, steady tokens/s, state size and save/load"
DESCRIPTION = (
    "Build the loader of CONFIG (a YAML file) on this machine and time it: the first "
    "batch, then, once this rank's shuffle buffers are full and --warmup more batches "
    "have passed, a window of at least --batches batches and --seconds seconds."
)


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = add_command(commands, "bench", run, HELP, DESCRIPTION)
    parser.add_argument("config", type=PathArg("local"), help="loader config YAML")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    parser.add_argument("--batches", type=positive_int, default=200, help="batches timed, at least")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds timed, at least")
    parser.add_argument(
        "--warmup",
        type=non_negative_int,
        default=20,
        help="untimed batches after the shuffle buffers are full",
    )
    parser.add_argument(
        "--workers",
        type=int_list,
        help="comma-separated num_workers values to measure in turn, e.g. 0,1,2,4 "
        "(default: the config's)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def tokens_per_second(iterator: Iterator[dict[str, Any]], warmup: int, batches: int) -> float:
    """Throughput of a batch iterator: ``batches`` timed after ``warmup`` untimed."""
    for _ in range(warmup):
        next(iterator)
    tokens = 0
    start = time.perf_counter()
    for _ in range(batches):
        tokens += next(iterator)["input_ids"].numel()
    return tokens / (time.perf_counter() - start)


def fill_batches(loader: FmsDataLoader) -> int:
    """Batches this rank takes while its shuffle buffers fill: ``shuffle_window`` lines in
    each logical shard it owns (0 without a shuffle buffer)."""
    config = loader.config
    window = config.shuffle_window if config.shuffle_window > 1 else 0
    return math.ceil(window * owned_shards(loader) / config.batch_size)


def owned_shards(loader: FmsDataLoader) -> int:
    """The logical shards this rank's loader reads."""
    return len(cast("RankLineDataset", loader.dataset).shard_ids)


def measure(
    loader: FmsDataLoader,
    warmup: int,
    batches: int,
    seconds: float = 0.0,
    calls_before: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Figures of one loader: first batch latency, steady tokens/s and what was timed (after
    ``fill_batches`` + ``warmup`` untimed batches, at least ``batches`` batches and
    ``seconds``), the state's size and save/load times, and the calls this rank made to
    object storage up to its first batch and in all (``requests_first_batch``,
    ``requests``: counted from ``calls_before``, this process's before the loader was
    built; ``fmsdata.remote.requests``)."""
    from fmsdata.state.file import state_from_bytes, state_to_bytes

    before = calls_before or {}
    start = time.perf_counter()
    iterator = iter(loader)
    next(iterator)
    first = time.perf_counter() - start
    first_calls = since(loader.remote_calls(), before)
    filling = fill_batches(loader)
    untimed = max(0, filling - 1) + warmup  # the first batch counts toward the fill
    for _ in range(untimed):
        next(iterator)
    tokens = timed = 0
    start = time.perf_counter()
    elapsed = 0.0
    while timed < batches or elapsed < seconds:
        tokens += next(iterator)["input_ids"].numel()
        timed += 1
        elapsed = time.perf_counter() - start
    start = time.perf_counter()
    state = loader.snapshot()
    data = state_to_bytes(state)
    save = time.perf_counter() - start
    start = time.perf_counter()
    loader.load_state_dict(state_from_bytes(data))
    load = time.perf_counter() - start
    del iterator
    all_calls = since(loader.remote_calls(), before)
    return {
        "num_workers": loader.config.num_workers,
        "first_batch_s": first,
        "warmup_batches": 1 + untimed,
        "fill_batches": filling,
        "timed_batches": timed,
        "timed_tokens": tokens,
        "timed_s": elapsed,
        "tokens_per_s": tokens / elapsed,
        "state_bytes": len(data),
        "state_save_s": save,
        "state_load_s": load,
        "requests_first_batch": first_calls,
        "requests": all_calls,
    }


def since(now: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """Counts of calls made between ``before`` and ``now``."""
    return {kind: count - before.get(kind, 0) for kind, count in now.items()}


def describe_calls(figures: dict[str, Any]) -> list[str]:
    """The calls to object storage of one rank, or nothing for a root on local disk."""
    lines = []
    for label, key in (("to 1st batch", "requests_first_batch"), ("in all", "requests")):
        calls = figures[key]
        made = {kind: n for kind, n in calls.items() if kind != "bytes" and n}
        if not made:
            continue
        listed = ", ".join(f"{n:,} {kind}" for kind, n in made.items())
        lines.append(
            f"requests/rank   {label}: {listed}; {calls['bytes'] / 1e6:,.1f} MB read "
            "(this process and its workers)"
        )
    return lines


def stage_figures(loader: FmsDataLoader) -> dict[str, dict[str, Any]]:
    """What the stages count in the loader's state now, per stage: its counts and ratios as
    ``fmsdata state show`` prints them (e.g. the best-fit packer's padding fraction,
    documents cut and documents per line, over the lines it has closed)."""
    from fmsdata.cli.state import summarize

    summary = summarize([loader.snapshot()])
    return {
        label: {**counts, **summary["stage_ratios"].get(label, {})}
        for label, counts in summary["stage_counts"].items()
    }


def describe(figures: dict[str, Any], config: Any, owned: int) -> list[str]:
    """What was timed, in words."""
    fill = figures["fill_batches"]
    why = (
        f"{fill} while the shuffle buffers fill ({owned} logical shard(s) x "
        f"{config.shuffle_window} lines, {config.batch_size} rows a batch)"
        if fill
        else "no shuffle buffer to fill"
    )
    return [
        f"warm-up         {figures['warmup_batches']:,} batches untimed: the first, {why}, "
        f"then --warmup {figures['warmup_batches'] - max(fill, 1)}",
        f"timed           {figures['timed_batches']:,} batches, "
        f"{figures['timed_tokens'] / 1e6:,.1f} M tokens, in {figures['timed_s']:.2f} s "
        "(steady state)",
    ]


def run(args: argparse.Namespace) -> int:
    from fmsdata.config import LoaderConfig
    from fmsdata.loader import build_dataloader
    from fmsdata.remote import requests
    from fmsdata.util import compiled

    config = LoaderConfig.from_yaml(args.config, args.overrides)
    counts = args.workers if args.workers is not None else [config.num_workers]
    results = []
    with compiled.serving("foreground"):  # the timed window runs compiled code
        for workers in counts:
            before = requests.as_dict(requests.counts())
            loader = build_dataloader(config.replace(num_workers=workers))
            figures = measure(loader, args.warmup, args.batches, args.seconds, before)
            figures["stages"] = stage_figures(loader)
            results.append((figures, owned_shards(loader)))
            del loader  # its workers stop before the next count starts
    if args.json:
        listed = [figures for figures, _ in results]
        print(json.dumps(listed if args.workers is not None else listed[0], indent=2))
        return 0
    for figures, owned in results:
        if len(results) > 1:
            print(f"num_workers {figures['num_workers']}:")
        print(
            f"first batch     {figures['first_batch_s'] * 1e3:9.1f} ms (kernels not in the "
            "cache compiled first)"
        )
        for line in describe(figures, config, owned):
            print(line)
        print(f"throughput      {figures['tokens_per_s'] / 1e6:9.1f} M tokens/s")
        print(f"state           {figures['state_bytes'] / 1024:9.1f} KiB")
        save, load = figures["state_save_s"] * 1e3, figures["state_load_s"] * 1e3
        print(f"state save/load {save:6.1f} / {load:.1f} ms")
        for label, figures_of_stage in figures["stages"].items():
            shown = ", ".join(f"{key} {_figure(value)}" for key, value in figures_of_stage.items())
            print(f"{label}: {shown}")
        for line in describe_calls(figures):
            print(line)
    if len(results) > 1:
        print(ranking([figures for figures, _ in results]))
    return 0


def _figure(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else f"{value:.4g}"


def ranking(results: list[dict[str, Any]]) -> str:
    """Worker counts from fastest to slowest; counts within ``TIE`` of the one before are
    called even (a shared machine's noise is of that size)."""
    ordered = sorted(results, key=lambda f: -f["tokens_per_s"])
    best = ordered[0]["tokens_per_s"]
    lines = ["steady throughput by num_workers, fastest first:"]
    for figures in ordered:
        rate = figures["tokens_per_s"]
        even = " (even with the fastest)" if rate >= best * (1 - TIE) and rate != best else ""
        lines.append(
            f"  {figures['num_workers']:>3} worker(s)  {rate / 1e6:9.1f} M tokens/s  "
            f"{rate / best:5.2f}x{even}"
        )
    return "\n".join(lines)
