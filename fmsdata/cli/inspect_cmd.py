"""``fmsdata inspect PATH``: what a shard file or a data root holds, in any format."""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import sys
import tempfile
from typing import TYPE_CHECKING, Any

from fmsdata.cli.parser import PathArg, add_command, non_negative_int
from fmsdata.cli.progress import Progress
from fmsdata.cli.storage_options import add_storage_options, remote_cache_dir, storage_from_args
from fmsdata.util.textcorpus import TOKENIZER_HINT

if TYPE_CHECKING:
    import numpy as np

# The built-in formats, named in --help without importing the handlers (pyarrow, numpy);
# a test checks this against the registry. Formats registered by users work too.
BUILTIN_FORMATS = (
    "arrow",
    "auto",
    "cepe",
    "hf_arrow",
    "jsonl",
    "mds",
    "megatron",
    "npy",
    "parquet",
    "pbin",
)


def add_format_options(parser: argparse.ArgumentParser, from_metadata: bool = False) -> None:
    """The options that say how to read shards (shared by index and inspect).
    ``from_metadata``: an unset ``--file-type`` is the one the root's ``metadata.json``
    records (``_use_root_metadata``), else ``auto``."""
    parser.add_argument(
        "--file-type",
        default=None if from_metadata else "auto",
        help=f"shard format: {', '.join(BUILTIN_FORMATS)} or a registered one; auto picks "
        "per file by its ending"
        + (
            " (default: the format the root's metadata.json records, else auto)"
            if from_metadata
            else ""
        ),
    )
    parser.add_argument("--col-name", default="tokens", help="token column (Arrow, Parquet, MDS)")
    parser.add_argument("--text-field", default="text", help="text field (JSONL, Parquet text)")
    parser.add_argument(
        "--tokenizer",
        type=PathArg("local", TOKENIZER_HINT),
        help="tokenizer.json, or the name of a bundled one (stdlib-bpe-4k), for text shards "
        "and decoding samples",
    )
    parser.add_argument("--token-dtype", help="token type of flat token files / MDS bytes columns")
    parser.add_argument("--separator", type=int, help="end-of-document token of flat token files")


def handler_from_args(args: argparse.Namespace):
    from fmsdata.handlers import make_handler

    return make_handler(
        args.file_type or "auto",
        col_name=args.col_name,
        text_field=args.text_field,
        tokenizer=args.tokenizer,
        token_dtype=args.token_dtype,
        separator=args.separator,
    )


HELP = "documents, tokens, length distribution and a decoded sample of shards"
DESCRIPTION = "Read a shard file, or every shard of a dataset folder or data root."


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = add_command(commands, "inspect", run, HELP, DESCRIPTION)
    parser.add_argument(
        "path", type=PathArg("read"), help="a shard file, a dataset folder or a data root"
    )
    add_format_options(parser, from_metadata=True)
    add_storage_options(parser)
    parser.add_argument(
        "--samples",
        type=non_negative_int,
        default=1,
        help="documents to print (decoded with --tokenizer, else with the tokenizer the "
        "root's metadata.json names; its EOS is the default --separator)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        type=PathArg("local"),
        help="also draw the document-length distribution and the tokens of each dataset "
        'into this image (needs matplotlib: pip install "fmsdata[plot]")',
    )


def _files(path: str, handler, storage) -> tuple[str, dict[str, list[str]]]:
    """``(root, {dataset: shard paths relative to root})`` of a file, a dataset folder or a
    data root. Shards directly in the folder make it one dataset named after it; else each
    top-level folder holding shards is a dataset (shards nested freely below it)."""
    from fmsdata.data.catalog import discover

    fs, base = storage.filesystem(path)
    name = path.rstrip("/").rsplit("/", 1)[-1] or path
    if fs.isfile(base):
        root, file = path.rstrip("/").rsplit("/", 1) if "/" in path else (".", path)
        return root, {name: [file]}
    listed = sorted(p for p, e in fs.find(base, detail=True).items() if e["type"] == "file")
    chosen = [p[len(base) + 1 :] for p in handler.select(listed)]
    if not chosen:
        catalog = discover(path, None, handler, storage, count=False)  # paths only
        return catalog.root, {ds.name: list(ds.paths) for ds in catalog.datasets}
    if any("/" not in p for p in chosen):
        return path, {name: chosen}
    groups: dict[str, list[str]] = {}
    for relative in chosen:
        groups.setdefault(relative.split("/", 1)[0], []).append(relative)
    return path, groups


def _length_summary(lengths: np.ndarray) -> dict[str, float]:
    import numpy as np

    if not len(lengths):
        return {}
    percentiles = {f"p{q}": float(np.percentile(lengths, q)) for q in (10, 50, 90, 99)}
    return {
        "min": float(lengths.min()),
        "mean": float(lengths.mean()),
        **percentiles,
        "max": float(lengths.max()),
    }


def _length_histogram(lengths: np.ndarray) -> dict[str, int]:
    """Document counts by power-of-two length bucket, ``[2^k, 2^(k+1))``."""
    import numpy as np

    if not len(lengths):
        return {}
    buckets = np.floor(np.log2(np.maximum(lengths, 1))).astype(np.int64)
    buckets[lengths == 0] = -1
    counts = np.bincount(buckets + 1)
    return {
        ("0" if k == 0 else f"{1 << (k - 1)}-{(1 << k) - 1}"): int(c)
        for k, c in enumerate(counts)
        if c
    }


def _use_root_metadata(args: argparse.Namespace, storage) -> None:
    """Fill what ``--file-type``, ``--tokenizer`` and ``--separator`` leave unset from the
    ``metadata.json`` of the root ``args.path`` lies in (the datasets' format, the tokenizer
    bundled there and its EOS), and refuse a given one that contradicts it, by the rule
    the loader applies to its config (``fmsdata.data.metadata.agree``)."""
    from fmsdata.data.metadata import METADATA_FILE, agree, check_file_type, root_facts
    from fmsdata.mapstyle.source import find_root_metadata
    from fmsdata.remote.storage import is_local

    found = find_root_metadata(args.path, storage)
    if found is None:
        return
    root, meta = found
    below = args.path.rstrip("/")[len(root.rstrip("/")) :].strip("/").split("/")[0]
    described = meta.get("datasets")
    named = [below] if isinstance(described, dict) and below in described else None
    facts = root_facts(meta, posixpath.join(root, METADATA_FILE), named)
    args.file_type = check_file_type(args.file_type, facts)
    if facts.documents_end_with_eos:  # flat streams are split on it: another one is wrong
        agree("separator", args.separator, facts.eos_token, facts.path, "it ends documents")
    if args.separator is None:
        args.separator = facts.eos_token
    relative = (meta.get("tokenizer") or {}).get("file")
    if args.tokenizer is None and relative:
        fs, local = storage.filesystem(posixpath.join(root, relative))
        if is_local(fs):
            args.tokenizer = local if fs.isfile(local) else None
        elif fs.isfile(local):
            copy = os.path.join(tempfile.mkdtemp(prefix="fmsdata-inspect-"), "tokenizer.json")
            fs.get_file(local, copy)
            args.tokenizer = copy


def _recorded_counts(root: str, files: list[str], storage) -> tuple[str, dict[str, int]]:
    """The counts metadata (``meta/*counts*.csv``) of the data root that ``root`` lies in
    (itself or up to three folders above): ``(counts root, {file under root: documents})``
    for the inspected files it records; empty when there is none."""
    from fmsdata.data.catalog import read_counts

    base = root.rstrip("/")
    for _ in range(4):
        keys = {f: posixpath.join(root.rstrip("/"), f)[len(base) + 1 :] for f in files}
        names = sorted({key.split("/", 1)[0] for key in keys.values()})
        counts = read_counts(base, names, storage)
        if counts:
            return base, {f: counts[key][0] for f, key in keys.items() if key in counts}
        if "/" not in base.strip("/"):
            break
        base = base.rsplit("/", 1)[0]
    return "", {}


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from fmsdata.data.access import count_mismatch
    from fmsdata.data.indexing import CACHE_LIMIT
    from fmsdata.handlers.text import TextTokenizer
    from fmsdata.remote.cache import file_source

    plot = _plotter(args.plot)
    storage = storage_from_args(args)
    _use_root_metadata(args, storage)
    handler = handler_from_args(args)
    root, groups = _files(args.path, handler, storage)
    files = [f for paths in groups.values() for f in paths]
    source = file_source(root, storage, remote_cache_dir(), CACHE_LIMIT, handler.companions)
    per_dataset: dict[str, list[Any]] = {name: [] for name in groups}
    dtypes, sample = set(), None
    counts_root, recorded = _recorded_counts(root, files, storage)
    mismatches = []
    with Progress(len(files), "files", label="reading ") as progress:
        for name, paths in groups.items():
            for relative in paths:
                reader = handler.open(source.local(relative))
                n = handler.num_docs(reader)
                if relative in recorded and recorded[relative] != n:
                    path = posixpath.join(root, relative)
                    mismatches.append(count_mismatch(path, n, recorded[relative]))
                lengths = handler.doc_lengths(reader, np.arange(n))
                per_dataset[name].append(np.asarray(lengths, dtype=np.int64))
                if n:
                    first = handler.get(reader, 0)
                    dtypes.add(str(first.dtype))
                    if sample is None:
                        picked = range(min(args.samples, n))
                        sample = [np.asarray(handler.get(reader, i)) for i in picked]
                handler.close(reader)
                source.release(relative)
                progress.update()
    source.close()
    by_dataset = {
        name: np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        for name, parts in per_dataset.items()
    }
    everything = np.concatenate(list(by_dataset.values()) or [np.zeros(0, dtype=np.int64)])
    dtype_names = sorted(dtypes)
    length = _length_summary(everything)
    histogram = _length_histogram(everything)
    if plot is not None:
        plot(by_dataset, args.plot, title=args.path)
    for mismatch in mismatches:
        print(f"fmsdata inspect: {mismatch} ({counts_root}/meta)", file=sys.stderr)
    if args.json:
        figures = {
            "files": len(files),
            "documents": int(len(everything)),
            "tokens": int(everything.sum()),
            "dtype": dtype_names,
            "length": length,
            "length_histogram": histogram,
            "count_mismatches": mismatches,
            "datasets": {
                name: {"documents": int(len(lens)), "tokens": int(lens.sum())}
                for name, lens in by_dataset.items()
            },
        }
        print(json.dumps(figures, indent=2))
        return 1 if mismatches else 0
    print(
        f"{len(files)} file(s), {len(everything):,} documents, "
        f"{int(everything.sum()):,} tokens, dtype {', '.join(dtype_names) or '-'}"
    )
    if len(by_dataset) > 1:
        for name, lens in by_dataset.items():
            print(f"  {name:16} {len(lens):>12,} documents {int(lens.sum()):>16,} tokens")
    print("document length: " + ", ".join(f"{k} {v:,.0f}" for k, v in length.items()))
    widest = max(histogram.values(), default=0)
    for bucket, count in histogram.items():
        print(f"  {bucket:>17} {count:>10,} {'#' * round(40 * count / widest)}")
    tokenizer = TextTokenizer(args.tokenizer) if args.tokenizer else None
    for i, doc in enumerate(sample or []):
        shown = (
            tokenizer.decode(doc.tolist()) if tokenizer else " ".join(map(str, doc[:64].tolist()))
        )
        print(f"\ndocument {i} ({len(doc)} tokens):\n{shown[:1500]}")
    if plot is not None:
        print(f"\nplot written to {args.plot}")
    return 1 if mismatches else 0


def _plotter(path: str | None):
    """The plotting function when ``--plot`` was given, checked before any reading."""
    if path is None:
        return None
    from fmsdata.cli.plots import check_plot_target, plot_documents

    check_plot_target(path)
    return plot_documents
