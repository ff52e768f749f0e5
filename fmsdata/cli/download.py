"""``fmsdata download SRC DEST``: copy a remote tree of shards to local disk, resumably."""

from __future__ import annotations

import argparse
import sys
import threading

from fmsdata.cli.parser import PathArg, add_command, positive_int
from fmsdata.cli.progress import Progress, human_bytes
from fmsdata.cli.storage_options import add_storage_options, storage_from_args

HELP = "copy shards from S3 (or any fsspec URL) to a local folder, resumably"
DESCRIPTION = (
    "Copy every file under SRC to DEST, keeping the key layout. Complete files are "
    "skipped (size and ETag), interrupted ones continue, each file is verified "
    "(size, and MD5 where the ETag allows it) before it appears under its name. "
    "Keys that would land outside DEST are refused. Exit status 1 when any file "
    "failed or was refused."
)


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = add_command(commands, "download", run, HELP, DESCRIPTION)
    parser.add_argument(
        "src", type=PathArg("read"), help="source URL or path (a prefix or a single object)"
    )
    parser.add_argument(
        "dest",
        type=PathArg("local", "download copies to this machine"),
        help="local destination folder",
    )
    parser.add_argument(
        "--jobs", type=positive_int, default=8, help="files transferred in parallel"
    )
    parser.add_argument(
        "--include", action="append", default=[], help="only keys matching this glob (repeat)"
    )
    parser.add_argument(
        "--exclude", action="append", default=[], help="skip keys matching this glob (repeat)"
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would be done")
    add_storage_options(parser)


def run(args: argparse.Namespace) -> int:
    from fmsdata.remote.mirror import plan_mirror, run_mirror

    storage = storage_from_args(args)
    plan, manifest = plan_mirror(args.src, args.dest, storage, args.include, args.exclude)
    for key, reason in plan.refused:
        print(f"refused {key!r}: {reason}", file=sys.stderr)
    head = (
        f"{len(plan.transfers)} file(s) to download ({human_bytes(plan.transfer_bytes)}), "
        f"{len(plan.complete)} already complete"
        + (f", {plan.excluded} filtered out" if plan.excluded else "")
        + (f", {len(plan.refused)} refused" if plan.refused else "")
    )
    if args.dry_run:
        print("dry run: " + head)
        for transfer in plan.transfers:
            print(f"  {transfer.key}  {human_bytes(transfer.info.size)}")
        return 1 if plan.refused else 0
    print(head, flush=True)
    lock = threading.Lock()
    with Progress(plan.transfer_bytes, "B", label="downloading ") as progress:
        files_done = [0]

        def on_bytes(n: int) -> None:
            with lock:
                progress.update(n)

        def on_file(key: str, error: str | None) -> None:
            with lock:
                files_done[0] += 1
                progress.update(0, f"{files_done[0]}/{len(plan.transfers)} files")
            if error is not None:
                print(f"\nfailed {key}: {error}", file=sys.stderr)

        result = run_mirror(
            args.src, args.dest, storage, plan, manifest, args.jobs, on_bytes, on_file
        )
    rate = result.transferred_bytes / max(result.seconds, 1e-9)
    print(
        f"downloaded {len(result.transferred)} file(s), {human_bytes(result.transferred_bytes)} "
        f"in {result.seconds:.1f}s ({human_bytes(rate)}/s); {len(plan.complete)} already "
        f"complete; {len(result.failed)} failed; {len(plan.refused)} refused"
    )
    return 1 if result.failed or plan.refused else 0
