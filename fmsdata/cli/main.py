"""Entry point: ``fmsdata <command> ...``.

The command modules import nothing heavy (torch, numpy, pyarrow, fsspec) at module level:
each ``run`` imports what it needs, so ``--help`` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from fmsdata.cli import (
    bench,
    demo,
    download,
    index,
    inspect_cmd,
    statecommand,
    tokenize,
    trace,
    verify,
    warm,
)
from fmsdata.cli.parser import ArgumentParser
from fmsdata.errors import FmsDataError

__all__ = ["main"]

COMMANDS = (
    demo,
    tokenize,
    index,
    inspect_cmd,
    download,
    bench,
    warm,
    statecommand,
    trace,
    verify,
)
# Set (to anything but 0) to get full tracebacks, as --debug does.
DEBUG_ENV = "FMSDATA_DEBUG"


def _version() -> str:
    """The installed distribution's version (its metadata: what pip installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fmsdata")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="fmsdata",
        description="Stateful, streaming, rescalable data loading for LLM pretraining.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    parser.add_argument("--version", action="version", version=f"fmsdata {_version()}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="on an error, print the full traceback (DataLoader workers' included) instead of "
        f"the one-line cause; also set by {DEBUG_ENV}=1",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.run(args) or 0)
    except (FmsDataError, FileNotFoundError) as err:
        if args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        print(f"fmsdata {args.command}: {type(err).__name__}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
