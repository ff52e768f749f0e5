"""``fmsdata index ROOT``: write ``meta/counts.csv`` (documents and tokens per shard)."""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor

from fmsdata.catalog import discover
from fmsdata.cli.progress import Progress
from fmsdata.files import local_path_resolver
from fmsdata.handlers import handler_names, make_handler
from fmsdata.indexing import write_counts


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


def _count(job: tuple[str, str, str, str]) -> tuple[str, int, int]:
    file_type, col_name, root, relative = job
    handler = make_handler(file_type, col_name=col_name)
    docs, tokens = handler.count(local_path_resolver(root)(relative))
    return relative, docs, tokens


def run(args: argparse.Namespace) -> int:
    handler = make_handler(args.file_type, col_name=args.col_name)
    datasets = [d for d in args.datasets.split(",") if d] if args.datasets else None
    catalog = discover(args.root, datasets, handler)
    jobs = [
        (args.file_type, args.col_name, catalog.root, rel)
        for ds in catalog.datasets
        for rel in ds.paths
    ]
    rows = []
    with Progress(len(jobs), "files", label="counting ") as progress:
        if args.workers > 1:
            with ProcessPoolExecutor(args.workers) as pool:
                for row in pool.map(_count, jobs, chunksize=8):
                    rows.append(row)
                    progress.update()
        else:
            for job in jobs:
                rows.append(_count(job))
                progress.update()
    target = write_counts(catalog.root, rows)
    docs = sum(r[1] for r in rows)
    tokens = sum(r[2] for r in rows)
    print(f"wrote {target}: {len(rows)} files, {docs:,} documents, {tokens:,} tokens")
    return 0
