"""Packing compared on one corpus: ``hard``, ``pad``, ``best_fit`` at two windows, and
OLMo-core's best-fit-decreasing (``packed_fsl``), in the same run on the same machine.

The corpus is ``benchmarks/throughput.py``'s ``long`` (two datasets 1:1, log-normal
lengths, median 600, mean 1,500 tokens, EOS per document; written there, or here on first
use), read through the same 64 logical shards.

1. **Packing, on the same documents** (span level, no token read): every logical shard's
   packer, as the loader builds it, for ``--lines`` lines (several windows of the
   largest). Per packing: the padding's share
   of the lines' tokens, the documents cut (all, and those no longer than a line: only
   ``hard`` cuts those), the mean document pieces per line, and the size of a packer's
   own saved state (a carry; best_fit's ready and open lines). Beside them OLMo-core's own
   best-fit-decreasing (``olmo_core.data.utils.InstancePacker``, "Optimized Best-Fit
   Decreasing" of Ding et al. 2024) over the same document sequence of each shard, at the
   same windows (a window's instances closed at its end, as ``packed_fsl`` closes them at
   the end of each source file; documents longer than a line fragmented first, its
   ``long_doc_strategy=fragment``). OLMo-core's packer needs a power of two, so this
   section packs 4,096-token lines (fmsdata at ``seq_length`` 4,095).
2. **Throughput, one DataLoader worker**: the loader of ``throughput.py``'s ``long`` row
   (seq 4,096, batch 8, 64 logical shards, about 10,000 buffered lines, timed after the
   buffers fill) per packing, as tokens/s and as a ratio to the *shuffled* bare read of
   the same files measured in the same run (``throughput.shuffled_read``: the memory cost
   of reading documents in a random order, before any loader logic). And OLMo-core's
   ``NumpyPackedFSLDataset`` + its data loader (one worker) over the same documents
   written as its flat token files: its padding, documents fragmented, and tokens/s (every
   figure counts ``batch x seq_length`` input tokens a batch, padding included).

Prints a table and writes ``benchmarks/results/packing.json``;
``benchmarks/measured/`` keeps the figures the README quotes.

    python benchmarks/packing.py               # full corpus (~150 M tokens)
    python benchmarks/packing.py --quick       # a tenth of it, short timings
    python benchmarks/packing.py --windows 32,128,1024 --no-olmo
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import throughput  # noqa: E402  (the corpus, its loader config and the bare reads)
from benchlib import write_results  # noqa: E402

from fmsdata import build_dataloader  # noqa: E402
from fmsdata.stages.shard import Shard  # noqa: E402
from fmsdata.stages.spans import DLEN, LENGTH, START  # noqa: E402
from fmsdata.state.file import state_to_bytes  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = "long"
LINE = 4096  # section 1: lines of this many tokens (OLMo-core's packer needs a power of 2)
PAD, EOS = 0, 2


# ---------------------------------------------------------------- section 1: packing


def corpus_config(root: str, mode: str, window: int, seq: int) -> dict[str, Any]:
    return {
        **throughput.loader_config(CORPUS, root),
        "seq_length": seq,
        "packing": mode,
        "pad_token": PAD,
        "pack_window": window,
        "num_workers": 0,
    }


def shard_lines(root: str, mode: str, window: int, lines: int) -> tuple[list[Any], float]:
    """The first ``lines`` lines of every logical shard's packer (blocks of spans), and the
    mean size of a packer's own saved state then (what it holds: a carry, or ready and open
    lines), in bytes of a state file."""
    loader = build_dataloader(corpus_config(root, mode, window, LINE - 1))
    context = loader.dataset.shard_context(throughput.SHARDS)
    try:
        out, sizes = [], []
        for sid in range(throughput.SHARDS):
            shard = Shard(sid, context.recipe, context.accesses)
            packer = shard.pack(shard.documents())
            out.append(packer.take_lines(lines))
            sizes.append(len(state_to_bytes(packer.own_state())))
        return out, statistics.mean(sizes)
    finally:
        context.close()


def span_figures(blocks: list[Any]) -> dict[str, float]:
    """Padding, cuts and pieces per line of packed lines of ``LINE`` tokens."""
    n_lines = pieces = padding = cut = cut_fitting = documents = 0
    for block in blocks:
        spans = block.spans
        fill = np.add.reduceat(spans[:, LENGTH], block.offsets[:-1])
        n_lines += len(block)
        pieces += len(spans)
        padding += int((LINE - fill).sum())
        first = spans[spans[:, START] == 0]  # each document's first piece
        documents += len(first)
        cut_here = first[first[:, LENGTH] < first[:, DLEN]]
        cut += len(cut_here)
        cut_fitting += int((cut_here[:, DLEN] <= LINE).sum())
    return {
        "lines": n_lines,
        "padding_fraction": padding / (n_lines * LINE),
        "documents": documents,
        "cut_documents": cut,
        "cut_documents_that_fit": cut_fitting,
        "documents_per_line": pieces / n_lines,
    }


def document_sequences(root: str, documents: int) -> list[np.ndarray]:
    """Each logical shard's first ``documents`` document lengths (with EOS), in the order
    its packer reads them (the mixer's)."""
    loader = build_dataloader(corpus_config(root, "hard", 1, LINE - 1))
    context = loader.dataset.shard_context(throughput.SHARDS)
    try:
        out = []
        for sid in range(throughput.SHARDS):
            source = Shard(sid, context.recipe, context.accesses).documents()
            lengths: list[np.ndarray] = []
            while sum(map(len, lengths)) < documents:
                lengths.append(source.read_ahead().dlen)
            out.append(np.concatenate(lengths)[:documents])
        return out
    finally:
        context.close()


def olmo_windows(sequences: list[np.ndarray], window: int) -> dict[str, float]:
    """OLMo-core's best-fit-decreasing per window of ``window`` documents of each shard
    (instances closed at the window's end), documents longer than a line fragmented."""
    from olmo_core.data.utils import InstancePacker

    packer = InstancePacker(LINE)
    instances = tokens = cut = pieces = documents = 0
    for lengths in sequences:
        for at in range(0, len(lengths) - window + 1, window):
            chunk = lengths[at : at + window]
            documents += len(chunk)
            cut += int((chunk > LINE).sum())
            parts: list[int] = []
            for n in chunk.tolist():
                parts += [LINE] * ((n - 1) // LINE) + [n - (n - 1) // LINE * LINE]
            starts = np.zeros(len(parts) + 1, dtype=np.int64)
            np.cumsum(parts, out=starts[1:])
            bins, _, packed = packer.pack_documents(np.stack([starts[:-1], starts[1:]], axis=1))
            instances += len(bins)
            pieces += len(parts)
            tokens += packed
            packer.reset()
    return {
        "lines": instances,
        "padding_fraction": 1 - tokens / (instances * LINE),
        "documents": documents,
        "cut_documents": cut,
        "cut_documents_that_fit": 0,
        "documents_per_line": pieces / instances,
    }


def packing_section(root: str, windows: list[int], lines: int, olmo: bool) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for mode, window in [("hard", 1), ("pad", 1)] + [("best_fit", w) for w in windows]:
        key = mode if mode != "best_fit" else f"best_fit {window}"
        print(f"  packing {key} ...", flush=True)
        blocks, state_bytes = shard_lines(root, mode, window, lines)
        rows[key] = {**span_figures(blocks), "packer_state_bytes_per_shard": state_bytes}
    if olmo:
        most = max(rows[f"best_fit {w}"]["documents"] for w in windows) // throughput.SHARDS
        sequences = document_sequences(root, most)
        for window in windows:
            # The whole windows of the documents best_fit packed into its lines.
            per_shard = rows[f"best_fit {window}"]["documents"] // throughput.SHARDS
            print(f"  OLMo-core OBFD {window} ...", flush=True)
            try:
                rows[f"olmo-core OBFD {window}"] = olmo_windows(
                    [s[: per_shard // window * window] for s in sequences], window
                )
            except Exception as exc:  # the row says why
                rows[f"olmo-core OBFD {window}"] = {"error": f"{type(exc).__name__}: {exc}"}
    return rows


# ---------------------------------------------------------------- section 2: throughput


def loader_rows(root: str, windows: list[int], batches: int, repeat: int) -> dict[str, Any]:
    """Tokens/s of the loader with one worker per packing, beside the shuffled bare read."""
    settings = [("hard", {"packing": "hard"}), ("pad", {"packing": "pad", "pad_token": PAD})]
    settings += [
        (f"best_fit {w}", {"packing": "best_fit", "pad_token": PAD, "pack_window": w})
        for w in windows
    ]
    base = {**throughput.loader_config(CORPUS, root), "num_workers": 1}
    runs: dict[str, list[dict[str, float]]] = {}
    for _ in range(repeat):
        shuffled = throughput.shuffled_read(root, 2.0)
        for key, overrides in settings:
            print(f"  loader {key} ...", flush=True)
            figures = throughput.pipeline_rate({**base, **overrides}, batches)
            figures["shuffled_tokens_per_s"] = shuffled
            figures["ratio_to_shuffled"] = figures["tokens_per_s"] / shuffled
            runs.setdefault(key, []).append(figures)
    return {
        key: {field: statistics.median(f[field] for f in figures) for field in figures[0]}
        for key, figures in runs.items()
    }


def flat_files(root: str, out: str) -> list[str]:
    """The corpus as OLMo-core's flat token files (uint32, EOS after each document), one
    per shard file (written once)."""
    from fmsdata.handlers import ArrowDocHandler

    handler = ArrowDocHandler()
    paths = sorted(
        os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".arrow")
    )
    os.makedirs(out, exist_ok=True)
    written = []
    for i, path in enumerate(paths):
        target = os.path.join(out, f"part-{i:05d}.npy")
        if not os.path.exists(target):
            reader = handler.open(path)
            handler.doc_lengths(reader, np.arange(handler.num_docs(reader)))  # locates them
            flat, starts, lengths = handler.token_buffer(reader)
            ends = starts + lengths
            pieces = []
            for a, b in zip(starts.tolist(), ends.tolist()):
                pieces += [flat[a:b], np.array([EOS], dtype=np.uint32)]
            np.concatenate(pieces).astype(np.uint32).tofile(target + ".tmp")
            os.replace(target + ".tmp", target)
            handler.close(reader)
        written.append(target)
    return written


def olmo_packed_fsl(root: str, batches: int, scratch: str) -> dict[str, Any]:
    """OLMo-core's ``NumpyPackedFSLDataset`` (best-fit-decreasing per source file, long
    documents fragmented) and its data loader with one worker, over the same documents."""
    from olmo_core.data import DataCollator, NumpyDataLoaderBase
    from olmo_core.data.numpy_dataset import NumpyPackedFSLDataset
    from olmo_core.data.types import LongDocStrategy

    files = flat_files(root, os.path.join(scratch, "flat"))
    dataset = NumpyPackedFSLDataset(
        *files,
        sequence_length=throughput.SEQ,
        pad_token_id=PAD,
        eos_token_id=EOS,
        vocab_size=2**31 - 1,
        dtype=np.uint32,
        long_doc_strategy=LongDocStrategy.fragment,
    )
    dataset.work_dir = os.path.join(scratch, "olmo-work")
    start = time.perf_counter()
    dataset.prepare()
    prepare_s = time.perf_counter() - start
    tokens = sum(os.path.getsize(p) // 4 for p in files)
    lengths = []
    for path in files:
        data = np.fromfile(path, dtype=np.uint32)
        lengths.append(np.diff(np.concatenate([[-1], np.flatnonzero(data == EOS)])))
    lengths = np.concatenate(lengths)
    instances = len(dataset)
    loader = NumpyDataLoaderBase.wrap_numpy_dataset(
        dataset,
        global_batch_size=throughput.BATCH * throughput.SEQ,
        collator=DataCollator(pad_token_id=PAD),
        work_dir=dataset.work_dir,
        num_workers=1,
        seed=0,
    )
    loader.reshuffle(epoch=1)
    iterator = iter(loader)
    for _ in range(20):
        next(iterator)
    seen = 0
    start = time.perf_counter()
    for _ in range(batches):
        seen += next(iterator)["input_ids"].numel()
    wall = time.perf_counter() - start
    del iterator
    return {
        "lines": instances,
        "padding_fraction": 1 - tokens / (instances * throughput.SEQ),
        "documents": len(lengths),
        "cut_documents": int((lengths > throughput.SEQ).sum()),
        "tokens_per_s": seen / wall,
        "prepare_s": prepare_s,
    }


# ---------------------------------------------------------------- report


def print_tables(results: dict[str, Any]) -> None:
    print(f"\n1. packing into {LINE}-token lines, the same documents of 64 logical shards")
    head = (
        f"{'packing':24} {'lines':>8} {'padding':>8} {'docs cut':>9} {'of which fit':>12} "
        f"{'docs/line':>9} {'state/shard':>11}"
    )
    print(head + "\n" + "-" * len(head))
    for key, row in results["packing"].items():
        if "error" in row:
            print(f"{key:24} {row['error']}")
            continue
        print(
            f"{key:24} {row['lines']:8,} {row['padding_fraction']:8.2%} "
            f"{row['cut_documents']:9,} {row['cut_documents_that_fit']:12,} "
            f"{row['documents_per_line']:9.2f} "
            + (
                f"{row['packer_state_bytes_per_shard'] / 1024:9.1f} KiB"
                if "packer_state_bytes_per_shard" in row
                else f"{'-':>11}"
            )
        )
    print(f"\n2. throughput with one worker, seq {throughput.SEQ}")
    head = f"{'loader':24} {'M tok/s':>8} {'vs shuffled read':>16} {'padding':>8} {'docs cut':>9}"
    print(head + "\n" + "-" * len(head))
    for key, row in results["throughput"].items():
        if "error" in row:
            print(f"{key:24} {row['error']}")
            continue
        ratio = row.get("ratio_to_shuffled")
        extra = ""
        if "padding_fraction" in row:
            extra = f" {row['padding_fraction']:8.2%} {row['cut_documents']:9,}"
        print(
            f"{key:24} {row['tokens_per_s'] / 1e6:8.1f} "
            f"{'-' if ratio is None else f'{ratio:.2f}':>16}{extra}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a tenth of the corpus, short")
    parser.add_argument("--windows", default="128,1024", help="best_fit pack_window values")
    parser.add_argument("--lines", type=int, default=None, help="lines per shard, section 1")
    parser.add_argument("--repeat", type=int, default=None, help="runs per throughput row")
    parser.add_argument("--no-olmo", action="store_true", help="leave OLMo-core out")
    parser.add_argument("--skip-throughput", action="store_true", help="section 1 only")
    parser.add_argument("--data", default=throughput.DATA)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "packing.json"))
    args = parser.parse_args()

    scale = 0.1 if args.quick else 1.0
    # Enough lines per shard for several windows of the largest (a window's lines are not
    # all emitted until the next window is placed).
    lines = args.lines or 1200
    batches = 300 if args.quick else 1500
    repeat = args.repeat or (1 if args.quick else 3)
    windows = [int(w) for w in args.windows.split(",") if w]
    root = os.path.join(args.data, f"{CORPUS}-{scale}")
    counts = throughput.ensure_corpus(root, CORPUS, scale)
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "settings": {
            "corpus": CORPUS,
            "scale": scale,
            "section_1_line": LINE,
            "lines_per_shard": lines,
            "windows": windows,
            "timed_batches": batches,
            "repeat": repeat,
        },
        "counts": counts,
    }
    print(f"packing {CORPUS} ({counts['tokens'] / 1e6:.0f} M tokens) ...", flush=True)
    results["packing"] = packing_section(root, windows, lines, not args.no_olmo)
    write_results(args.out, results)
    if not args.skip_throughput:
        results["throughput"] = loader_rows(root, windows, batches, repeat)
        if not args.no_olmo:
            print("  OLMo-core packed_fsl ...", flush=True)
            with tempfile.TemporaryDirectory() as scratch:
                try:
                    row = olmo_packed_fsl(root, batches, scratch)
                    shuffled = statistics.median(
                        r["shuffled_tokens_per_s"] for r in results["throughput"].values()
                    )
                    row["ratio_to_shuffled"] = row["tokens_per_s"] / shuffled
                except Exception as exc:  # the row says why
                    row = {"error": f"{type(exc).__name__}: {exc}"}
                results["throughput"]["olmo-core packed_fsl"] = row
        write_results(args.out, results)
    else:
        results["throughput"] = {}
    print_tables(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
