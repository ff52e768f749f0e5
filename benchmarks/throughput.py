"""Loader throughput, time to first batch, memory and state cost, beside a bare read.

Every figure is taken in this run on this machine, next to a baseline measured on the
same token files: a bare memory-mapped read of ``seq_length + 1``-token windows into int64
tensors (no logic at all). Ratios to that baseline are what to compare across machines.

    python benchmarks/throughput.py            # full run (~1.5 GB of generated shards)
    python benchmarks/throughput.py --quick    # smaller corpus and fewer batches

Prints a table and writes ``benchmarks/results/throughput.json``.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch
from benchlib import write_results

from fmsdata import build_dataloader
from fmsdata.checkpoint import load_loader_state, save_loader_state
from fmsdata.cli.bench import tokens_per_second
from fmsdata.handlers import ArrowDocHandler
from fmsdata.indexing import index_root
from fmsdata.state import stage_state
from fmsdata.synthetic import write_corpus

HERE = os.path.dirname(os.path.abspath(__file__))


def ensure_corpus(root: str, files: int, docs: int, mean: float) -> None:
    marker = os.path.join(root, f".complete-{files}-{docs}-{mean}")
    if os.path.exists(marker):
        return
    print(f"writing corpus under {root} ...", flush=True)
    write_corpus(root, {"web": files, "code": files}, docs_per_file=docs, mean_length=mean, seed=1)
    index_root(root, ArrowDocHandler(), workers=2)
    open(marker, "w").close()


def bare_read(root: str, line_length: int, seconds: float) -> float:
    """Tokens/s of reading consecutive windows of the shard files into int64 tensors."""
    paths = [
        os.path.join(d, f) for d, _, fs in os.walk(root) for f in sorted(fs) if f.endswith(".arrow")
    ]
    tokens = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for path in paths:
            size = os.path.getsize(path) // 4
            data = np.memmap(path, dtype=np.uint32, mode="r", shape=(size,))
            for at in range(0, size - line_length, line_length):
                torch.from_numpy(data[at : at + line_length].astype(np.int64))
                tokens += line_length - 1
            if time.perf_counter() - start > seconds:
                break
    return tokens / (time.perf_counter() - start)


def worker_memory(pids: list[int]) -> dict[str, float]:
    """Peak resident and private (anonymous) memory of the DataLoader workers, MB."""
    out = {"peak_rss_mb": 0.0, "anon_rss_mb": 0.0}
    for pid in pids:
        with open(f"/proc/{pid}/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
        out["peak_rss_mb"] = max(out["peak_rss_mb"], int(fields["VmHWM"].split()[0]) / 1024)
        out["anon_rss_mb"] = max(out["anon_rss_mb"], int(fields["RssAnon"].split()[0]) / 1024)
    return out


def pipeline_rate(config: dict[str, Any], warmup: int, batches: int) -> dict[str, float]:
    loader = build_dataloader(config)
    figures = {"tokens_per_s": tokens_per_second(iter(loader), warmup, batches)}
    if loader.worker_pids():
        figures.update(worker_memory(loader.worker_pids()))
    return figures


def first_batch_time(config: dict[str, Any]) -> float:
    start = time.perf_counter()
    loader = build_dataloader(config)
    next(iter(loader))
    return time.perf_counter() - start


def state_cost(config: dict[str, Any], batches: int, directory: str) -> dict[str, float]:
    """Save and load of one rank's loader checkpoint file (``fmsdata.checkpoint``)."""
    loader = build_dataloader(config)
    iterator = iter(loader)
    for _ in range(batches):
        next(iterator)
    start = time.perf_counter()
    path = save_loader_state(loader, directory)
    save = time.perf_counter() - start
    fresh = build_dataloader(config)
    start = time.perf_counter()
    load_loader_state(fresh, directory)
    load = time.perf_counter() - start
    snapshot = fresh.snapshot()
    buffers = [
        stage_state(e["state"], snapshot["fingerprint"], "shuffle") for e in snapshot["shards"]
    ]
    lines = sum(len(b["buffer"]["offsets"]) - 1 for b in buffers if b is not None)
    return {
        "state_bytes": os.path.getsize(path),
        "buffered_lines": lines,
        "save_s": save,
        "load_s": load,
    }


def many_files_root(directory: str, n_files: int) -> str:
    root = os.path.join(directory, f"many-{n_files}")
    marker = os.path.join(root, ".complete")
    if not os.path.exists(marker):
        write_corpus(root, {"a": n_files // 2, "b": n_files // 2}, docs_per_file=4, mean_length=50)
        index_root(root, ArrowDocHandler(), workers=2)
        open(marker, "w").close()
    return root


def row(label: str, value: str, ratio: float | None = None) -> None:
    print(f"{label:46} {value:>16} {'' if ratio is None else f'{ratio:12.2f}'}")


def print_table(results: dict[str, Any]) -> None:
    bare = results["bare_read_tokens_per_s"]
    print(f"\n{'measure':46} {'value':>16} {'vs bare read':>12}")
    row("bare memmap read (tokens/s)", f"{bare / 1e6:.1f} M", 1.0)
    for workers in (0, 1, 2):
        figures = results[f"pipeline_{workers}_workers"]
        where = "in-process" if workers == 0 else f"{workers} worker(s)"
        rate = figures["tokens_per_s"]
        row(f"full pipeline, {where} (tokens/s)", f"{rate / 1e6:.1f} M", rate / bare)
        if "peak_rss_mb" in figures:
            memory = f"{figures['peak_rss_mb']:.0f} / {figures['anon_rss_mb']:.0f}"
            row("  worker peak RSS / private RSS (MB)", memory)
    for name, value in results["first_batch_s"].items():
        row(f"time to first batch, {name.replace('_', ' ')} (s)", f"{value:.3f}")
    state = results["state"]
    row(
        f"state per rank ({state['buffered_lines']} lines buffered)",
        f"{state['state_bytes'] / 1024:.1f} KiB",
    )
    row("state save / load (ms)", f"{state['save_s'] * 1e3:.1f} / {state['load_s'] * 1e3:.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small corpus, short timings")
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "fmsdata-bench"))
    parser.add_argument("--out", default=os.path.join(HERE, "results", "throughput.json"))
    args = parser.parse_args()

    files, docs = (16, 1500) if args.quick else (64, 1500)
    seconds, batches = (3.0, 400) if args.quick else (8.0, 2000)
    root = os.path.join(args.data, f"corpus-{files}")
    ensure_corpus(root, files, docs, 1000)
    seq = 4096
    base = dict(
        data_path=root,
        datasets=["web", "code"],
        weights=[0.7, 0.3],
        seq_length=seq,
        batch_size=8,
        logical_shards=64,
        shuffle_window=156,  # 64 x 156 = about 10,000 buffered lines per rank
        bos_token=1,
        eos_token=2,
    )
    # Fill the shuffle buffers (10k lines pulled at two per step) before timing.
    warmup = 1300

    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
        }
    }
    results["bare_read_tokens_per_s"] = bare_read(root, seq + 1, seconds)
    for workers in (0, 1, 2):
        key = f"pipeline_{workers}_workers"
        results[key] = pipeline_rate({**base, "num_workers": workers}, warmup, batches)
    results["first_batch_s"] = {
        "64_shards": first_batch_time({**base, "num_workers": 1}),
        "1024_shards": first_batch_time(
            {**base, "num_workers": 1, "logical_shards": 1024, "shuffle_window": 10}
        ),
    }
    many = many_files_root(args.data, 10_000)
    results["first_batch_s"]["10000_files"] = first_batch_time(
        dict(
            data_path=many,
            seq_length=seq,
            batch_size=8,
            logical_shards=64,
            eos_token=2,
            num_workers=1,
        )
    )
    with tempfile.TemporaryDirectory() as scratch:
        results["state"] = state_cost({**base, "num_workers": 1}, 1300, scratch)
    results["peak_rss_main_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    print_table(results)
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
