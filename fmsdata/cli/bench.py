"""``fmsdata bench CONFIG``: time to first batch, throughput and state cost of a loader."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fmsdata.cli.parser import PathArg, non_negative_int, positive_int

if TYPE_CHECKING:
    from fmsdata.loader import FmsDataLoader


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "bench",
        help="measure a loader config: first batch, tokens/s, state size and save/load time",
        description="Build the loader of CONFIG (a YAML file) on this machine and time it.",
    )
    parser.add_argument("config", type=PathArg("local"), help="loader config YAML")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    parser.add_argument("--batches", type=positive_int, default=200, help="batches to time")
    parser.add_argument("--warmup", type=non_negative_int, default=20, help="batches before timing")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.set_defaults(run=run)


def tokens_per_second(iterator: Iterator[dict[str, Any]], warmup: int, batches: int) -> float:
    """Steady throughput of a batch iterator: ``batches`` timed after ``warmup`` untimed."""
    for _ in range(warmup):
        next(iterator)
    tokens = 0
    start = time.perf_counter()
    for _ in range(batches):
        tokens += next(iterator)["input_ids"].numel()
    return tokens / (time.perf_counter() - start)


def measure(loader: FmsDataLoader, warmup: int, batches: int) -> dict[str, Any]:
    """Figures of one loader: first batch latency, steady tokens/s, state size and timings."""
    from fmsdata.statefile import state_from_bytes, state_to_bytes

    start = time.perf_counter()
    iterator = iter(loader)
    next(iterator)
    first = time.perf_counter() - start
    rate = tokens_per_second(iterator, warmup, batches)
    start = time.perf_counter()
    state = loader.snapshot()
    data = state_to_bytes(state)
    save = time.perf_counter() - start
    start = time.perf_counter()
    loader.load_state_dict(state_from_bytes(data))
    load = time.perf_counter() - start
    del iterator
    return {
        "first_batch_s": first,
        "tokens_per_s": rate,
        "state_bytes": len(data),
        "state_save_s": save,
        "state_load_s": load,
    }


def run(args: argparse.Namespace) -> int:
    from fmsdata.config import LoaderConfig
    from fmsdata.loader import build_dataloader

    config = LoaderConfig.from_yaml(args.config, args.overrides)
    figures = measure(build_dataloader(config), args.warmup, args.batches)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"first batch     {figures['first_batch_s'] * 1e3:9.1f} ms")
        print(f"throughput      {figures['tokens_per_s'] / 1e6:9.1f} M tokens/s")
        print(f"state           {figures['state_bytes'] / 1024:9.1f} KiB")
        save, load = figures["state_save_s"] * 1e3, figures["state_load_s"] * 1e3
        print(f"state save/load {save:6.1f} / {load:.1f} ms")
    return 0
