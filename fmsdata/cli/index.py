"""``fmsdata index ROOT``: write ``meta/counts.csv`` (documents and tokens per shard)."""

from __future__ import annotations

import argparse

from fmsdata.cli.inspect_cmd import add_format_options, handler_from_args
from fmsdata.cli.parser import PathArg, add_command, positive_int
from fmsdata.cli.progress import Progress
from fmsdata.cli.storage_options import add_storage_options, storage_from_args

HELP = "count documents and tokens of every shard into ROOT/meta/counts.csv"
DESCRIPTION = (
    "Open every shard under ROOT (all dataset folders, or --datasets) and write "
    "ROOT/meta/counts.csv with header dataset/filename,documents,tokens, the "
    "metadata the loader reads instead of opening files."
)


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = add_command(commands, "index", run, HELP, DESCRIPTION)
    parser.add_argument(
        "root",
        type=PathArg("write"),
        help="data root (local path or fsspec URL); meta/counts.csv is written into it",
    )
    parser.add_argument("--datasets", help="comma-separated dataset folders (default: all)")
    add_format_options(parser)
    add_storage_options(parser)
    parser.add_argument("--workers", type=positive_int, default=1, help="parallel processes")


def run(args: argparse.Namespace) -> int:
    from fmsdata.data.indexing import index_root

    handler = handler_from_args(args)
    datasets = [d for d in args.datasets.split(",") if d] if args.datasets else None
    with Progress(None, "files", label="counting ") as progress:

        def bar(done: int, total: int) -> None:
            progress.total = total
            progress.update(done - progress.done)

        target, rows = index_root(
            args.root,
            handler,
            datasets,
            args.workers,
            storage=storage_from_args(args),
            progress=bar,
        )
    docs = sum(r[1] for r in rows)
    tokens = sum(r[2] for r in rows)
    print(f"wrote {target}: {len(rows)} files, {docs:,} documents, {tokens:,} tokens")
    return 0
