"""``fmsdata verify --config C.yaml``: run a pipeline unbroken and saved, resumed and
rescaled, and report "exact" or the first step, rank and stage that differ."""

from __future__ import annotations

import argparse
import json
import sys

from fmsdata.cli.objects import load_object
from fmsdata.cli.parser import PathArg, add_command, int_at_least, int_list
from fmsdata.errors import ConfigError

HELP = "check that a pipeline (your stages included) resumes and rescales exactly"
DESCRIPTION = (
    "Run the loader of CONFIG unbroken, then saved and resumed at several points "
    "(start, middle, both sides of an epoch boundary), with each worker count and "
    "on each other world size, comparing every global step's tokens. Prints "
    "'exact' with what was covered, or the first global step that differs, the "
    "rank, and the stage whose state did not carry it. Point CONFIG at a small "
    "slice of the data (a few files per dataset) and pick --steps so that an "
    "epoch ends within them: a few minutes on a laptop. Exits 1 when not exact."
)


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = add_command(commands, "verify", run, HELP, DESCRIPTION)
    parser.add_argument("--config", required=True, type=PathArg("local"), help="loader config YAML")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    parser.add_argument(
        "--stages",
        metavar="MODULE:FUNCTION",
        help="your stage factory, as passed to build_dataloader(stages=...): an importable "
        "module or a .py file, and the function's name (default: the built-in chain)",
    )
    parser.add_argument(
        "--handler",
        metavar="MODULE:CLASS",
        action="append",
        default=[],
        help="a FileHandler subclass to register (a format of your own), repeatable",
    )
    parser.add_argument(
        "--steps", type=int_at_least(2), default=40, help="global steps of every run"
    )
    parser.add_argument(
        "--world-sizes",
        type=int_list,
        default=[1, 2],
        help="world sizes, comma-separated; the first is the reference, whose per-rank "
        "batch is the config's batch_size (the global batch stays the same)",
    )
    parser.add_argument(
        "--workers",
        type=int_list,
        default=[0, 2],
        help="DataLoader worker counts, comma-separated; the first is the reference's",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from fmsdata.config import LoaderConfig
    from fmsdata.handlers import FileHandler, register_handler
    from fmsdata.verify.runs import verify

    for spec in args.handler:
        cls = load_object(spec, "--handler")
        if not (isinstance(cls, type) and issubclass(cls, FileHandler)):
            raise ConfigError(f"--handler {spec!r} is not a FileHandler subclass")
        register_handler(cls)
    stages = load_object(args.stages, "--stages") if args.stages else None
    if stages is not None and not callable(stages):
        raise ConfigError(f"--stages {args.stages!r} is not a function")
    config = LoaderConfig.from_yaml(args.config, args.overrides)

    def progress(what: str) -> None:
        if not args.json:
            print(f"... {what}", file=sys.stderr, flush=True)

    report = verify(config, stages, args.steps, args.world_sizes, args.workers, progress)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.text())
    return 0 if report.exact else 1
