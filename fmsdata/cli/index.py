"""``fmsdata index ROOT``: write ``meta/counts.csv`` (documents and tokens per shard)."""

from __future__ import annotations

import argparse

from fmsdata.cli.progress import Progress
from fmsdata.handlers import handler_names, make_handler
from fmsdata.indexing import index_root


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "index",
        help="count documents and tokens of every shard into ROOT/meta/counts.csv",
        description=(
            "Open every shard under ROOT (all dataset folders, or --datasets) and write "
            "ROOT/meta/counts.csv with header dataset/filename,documents,tokens, the "
            "metadata the loader reads instead of opening files."
        ),
    )
    parser.add_argument("root", help="data root (local path or fsspec URL)")
    parser.add_argument("--datasets", help="comma-separated dataset folders (default: all)")
    parser.add_argument(
        "--file-type", default="arrow", help=f"shard format: {', '.join(handler_names())}"
    )
    parser.add_argument("--col-name", default="tokens", help="token column (Arrow/Parquet)")
    parser.add_argument("--workers", type=int, default=1, help="parallel processes")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    handler = make_handler(args.file_type, col_name=args.col_name)
    datasets = [d for d in args.datasets.split(",") if d] if args.datasets else None
    with Progress(None, "files", label="counting ") as progress:
        target, rows = index_root(args.root, handler, datasets, args.workers, progress.update)
    docs = sum(r[1] for r in rows)
    tokens = sum(r[2] for r in rows)
    print(f"wrote {target}: {len(rows)} files, {docs:,} documents, {tokens:,} tokens")
    return 0
