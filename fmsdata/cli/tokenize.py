"""``fmsdata tokenize INPUT... --tokenizer T --output-dir OUT``: raw text to token shards."""

from __future__ import annotations

import argparse
import re
import sys
import time
from typing import Any

from fmsdata.cli.parser import PathArg, add_command, non_negative_int, positive_int
from fmsdata.cli.progress import Progress
from fmsdata.util.textcorpus import TOKENIZER_HINT

__all__ = ["add_parser", "run", "parse_size"]

# fmsdata.tokenize's output formats and backends, named here so that --help and argument
# errors need not import the tokenizer machinery; a test checks they match.
OUTPUT_FORMATS = ("arrow", "megatron", "flat", "pbin", "mds")
BACKENDS = ("local", "ray")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``256MB``, ``1GiB``, ``1000000`` -> bytes (k/m/g/t are powers of 1024)."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 256MB, 1GB, 1000000)")
    power = "bkmgt".index((match.group(2) or "b")[0].lower())
    return int(float(match.group(1)) * (1 << (10 * power)))


HELP = "tokenize JSONL / Parquet / text files into token shards (Arrow, Megatron, flat, .pbin, MDS)"
DESCRIPTION = (
    "Tokenize raw text into a data root the loader reads: OUT/DATASET/shard-NNNNN.arrow "
    "(Bamba layout: one record batch per document), OUT/meta/counts.csv and "
    "OUT/metadata.json. The output is the same bytes whatever the number of workers, "
    "SLURM tasks (--num-shards/--shard-id) or the backend; a rerun skips finished "
    "shards (--restart starts over). Bad records are counted per file (or fatal "
    "with --strict)."
)


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = add_command(commands, "tokenize", run, HELP, DESCRIPTION)
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        type=PathArg("local", "tokenize reads local files: copy them first (fmsdata download)"),
        help="files or folders of text",
    )
    parser.add_argument(
        "--tokenizer",
        required=True,
        type=PathArg("local", TOKENIZER_HINT),
        help="a tokenizers tokenizer.json, or the name of a bundled one (stdlib-bpe-4k)",
    )
    parser.add_argument(
        "--output-dir",
        required=True,
        type=PathArg("local", "tokenize writes a local data root; upload it once written"),
        help="data root to write",
    )
    parser.add_argument("--dataset", default="default", help="dataset folder of the shards")
    parser.add_argument(
        "--text-field", default="text", help="JSON field / Parquet column of the text"
    )
    parser.add_argument(
        "--shard-size",
        type=parse_size,
        help="input bytes per output shard (default: the inputs' total / 64, between 1MB "
        "and 256MB, so that up to 64 workers or tasks have a shard each; the same for any "
        "--workers, as the output is)",
    )
    parser.add_argument(
        "--format",
        choices=OUTPUT_FORMATS,
        default="arrow",
        dest="fmt",
        help="shard format written: arrow (Bamba), megatron (.bin+.idx), flat (tatm/OLMo token "
        "streams with EOS), pbin (Modalities), mds (MosaicML streaming); see the "
        "table in docs/guide/tokenize.md",
    )
    parser.add_argument(
        "--eos-token",
        type=int,
        help="end-of-document token written by flat and pbin (default: the tokenizer's EOS)",
    )
    parser.add_argument("--workers", type=positive_int, default=1, help="processes on this machine")
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="local",
        help="local: --workers processes here; ray: tasks on the Ray cluster of RAY_ADDRESS "
        '(pip install "fmsdata[ray]")',
    )
    parser.add_argument("--num-shards", type=positive_int, default=1, help="tasks sharing the work")
    parser.add_argument(
        "--shard-id", type=non_negative_int, default=0, help="this task (0..num-shards-1)"
    )
    parser.add_argument("--strict", action="store_true", help="fail on the first bad record")
    parser.add_argument(
        "--restart",
        action="store_true",
        help="delete this dataset's earlier output in --output-dir first (its shards, its "
        "records in meta/tokenize/DATASET, its rows of meta/counts.csv and metadata.json): "
        "to rerun with other settings or inputs",
    )


def run(args: argparse.Namespace) -> int:
    from fmsdata.tokenize import TokenizeSpec, run_tokenize

    spec = TokenizeSpec(
        output_dir=args.output_dir,
        dataset=args.dataset,
        tokenizer=args.tokenizer,
        text_field=args.text_field,
        shard_bytes=args.shard_size,
        output_format=args.fmt,
        strict=args.strict,
        eos_token=args.eos_token,
    )
    start = time.perf_counter()
    totals = {"documents": 0, "tokens": 0}
    progress: Progress | None = None

    def on_plan(todo: list[Any]) -> None:
        nonlocal progress
        if args.backend == "local" and 0 < len(todo) < args.workers:
            print(
                f"--workers {args.workers}: {len(todo)} shard(s) to write, so at most "
                f"{len(todo)} work at once (a smaller --shard-size makes more shards)",
                file=sys.stderr,
            )
        progress = Progress(sum(u.weight for u in todo), "B", label="tokenizing ")

    def on_progress(documents: int, tokens: int) -> None:
        totals["documents"] += documents
        totals["tokens"] += tokens
        if progress is not None:
            progress.update(0, status())

    def on_unit(record: dict[str, Any]) -> None:
        if progress is not None:
            progress.update(record["input_bytes"], status())

    def status() -> str:
        rate = totals["tokens"] / max(time.perf_counter() - start, 1e-9)
        return (
            f"{totals['documents']:,} docs, {totals['tokens']:,} tokens, {rate / 1e6:.2f} M tok/s"
        )

    try:
        result = run_tokenize(
            spec,
            args.inputs,
            workers=args.workers,
            backend=args.backend,
            num_shards=args.num_shards,
            shard_id=args.shard_id,
            on_unit=on_unit,
            on_plan=on_plan,
            on_progress=on_progress,
            restart=args.restart,
        )
    finally:
        if progress is not None:
            progress.close()
    seconds = time.perf_counter() - start
    print(
        f"{len(result.written)} shard(s) written ({totals['documents']:,} documents, "
        f"{totals['tokens']:,} tokens, {totals['tokens'] / max(seconds, 1e-9) / 1e6:.2f} M "
        f"tokens/s), {result.skipped} already done, of {result.mine} for this task "
        f"({result.units} in the run)"
    )
    if not result.complete:
        print("other tasks' shards are not all done yet: the last task writes the metadata")
        return 0
    print(
        f"{args.output_dir}: {result.units} shard(s), {result.documents:,} documents, "
        f"{result.tokens:,} tokens; meta/counts.csv and metadata.json written"
    )
    for path, problems in sorted(result.bad_records.items()):
        detail = ", ".join(f"{n} {what}" for what, n in sorted(problems.items()))
        print(f"skipped bad records in {path}: {detail}", file=sys.stderr)
    return 0
