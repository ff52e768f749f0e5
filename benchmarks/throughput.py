"""Loader throughput per corpus, beside a bare read of the same tokens in the same run.

Every figure is taken in this run on this machine, next to a baseline measured on the
same token files: a bare memory-mapped read of ``seq_length + 1``-token windows into int64
tensors (no logic at all). Ratios to that baseline are what to compare across machines.

Corpora (all generated, two datasets 1:1 unless said, seq 4096, batch 8, 64 logical
shards, about 10,000 buffered lines, EOS per document):

- ``long``: log-normal lengths, median 600, mean 1,500 tokens;
- ``short``: log-normal lengths, median 150, mean 300 tokens;
- ``doc60``: documents of about 60 tokens;
- ``mix``: three datasets, ``long`` and ``short`` documents plus a small one (2% of the
  tokens) upweighted to 20% of the mix, so it cycles through many epochs;
- ``smallmix``: 1,024 logical shards, ``short`` documents mixed 1:1 with a small dataset of
  1,100 documents of about 60 tokens (at full size), each shard's share of it far below a
  line: it rotates its portions over the shards' epochs (docs/guide/document-order.md).

Per corpus: tokens/s in process and with each worker count asked for, each as a ratio to
the bare read taken just before it, and to a *shuffled* bare read of the same files (each
file's documents gathered in a random order through a prebuilt index: the memory cost of
reading documents shuffled, before any loader logic — the ceiling for any loader that
shuffles documents); the amortized cost per document; the main process's
CPU time per delivered token (batch assembly, pinning, state bookkeeping), scaled to a
share of one core at 100 M tokens/s; each worker's memory after the timed batches
(``RssAnon``, and its ``Private_Dirty`` part, largest over the workers); state size and
save time at about 10,000 buffered lines. Where CUDA is available, also each worker count
with ``pin_memory``, and the hand-over to the GPU (``gpu_transfer``;
``benchmarks/gpu_host.sh`` runs it all on a GPU host). Prints a table, writes
``benchmarks/results/throughput.json`` and a chart of the ratios
(``benchmarks/throughput.png``, needs matplotlib).

    python benchmarks/throughput.py                      # full run (~1.5 GB of shards)
    python benchmarks/throughput.py --quick              # small corpora, short timings
    python benchmarks/throughput.py --workers 1,2,4,8    # worker scaling (many cores)
    python benchmarks/throughput.py --prepare            # only write the corpora
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch
from benchlib import pyplot, write_results

from fmsdata import build_dataloader
from fmsdata.checkpoint import save_loader_state
from fmsdata.data.indexing import index_root
from fmsdata.data.synthetic import write_corpus
from fmsdata.handlers import ArrowDocHandler
from fmsdata.stages.savedchain import stage_state

HERE = os.path.dirname(os.path.abspath(__file__))
SEQ = 4096
BATCH = 8
# 64 shards x 156 lines = about 10,000 buffered lines per rank; filling them (two lines
# pulled per step until full) takes about 1,250 batches, so timing starts after that.
SHARDS, WINDOW, WARMUP = 64, 156, 1300
DATA = os.path.join(tempfile.gettempdir(), "fmsdata-bench")  # where the corpora are written
# A state holds the buffers as of the last round's end (fmsdata.transport.rounds.item_rounds: in
# process here, from batch 191, rounds of 1,024 batches on long, short and 60-token
# documents), plus the lines consumed since: it is taken where the last round ended with
# the buffers full (batch 2239 on every corpus).
STATE_AT = 2300


def spread(median: float, mean: float) -> float:
    """Log-normal sigma with the given median and mean (mean = median * exp(sigma^2 / 2))."""
    return math.sqrt(2 * math.log(mean / median))


# name -> {dataset: (files, mean length, sigma, documents per file at full size)}, weights
CORPORA: dict[str, tuple[dict[str, tuple[int, float, float, int]], list[float]]] = {
    "long": (
        {"web": (32, 1500, spread(600, 1500), 1560), "code": (32, 1500, spread(600, 1500), 1560)},
        [1.0, 1.0],
    ),
    "short": (
        {"web": (32, 300, spread(150, 300), 3120), "code": (32, 300, spread(150, 300), 3120)},
        [1.0, 1.0],
    ),
    "doc60": ({"web": (32, 60, 0.4, 5200), "code": (32, 60, 0.4, 5200)}, [1.0, 1.0]),
    "mix": (
        {
            "web": (24, 1500, spread(600, 1500), 1560),
            "code": (24, 300, spread(150, 300), 3120),
            "small": (2, 300, spread(150, 300), 1560),
        },
        [0.4, 0.4, 0.2],
    ),
    "smallmix": (
        {"web": (32, 300, spread(150, 300), 3120), "small": (1, 60, 0.4, 1100)},
        [0.5, 0.5],
    ),
}
# Logical shards per corpus where not SHARDS.
CORPUS_SHARDS = {"smallmix": 1024}


def ensure_corpus(root: str, name: str, scale: float) -> dict[str, Any]:
    """Write (once) the shards of corpus ``name``; returns its token and document counts."""
    datasets, _ = CORPORA[name]
    marker = os.path.join(root, ".complete")
    if not os.path.exists(marker):
        print(f"writing corpus {name!r} under {root} ...", flush=True)
        first = 16
        for i, (dataset, (files, mean, sigma, docs)) in enumerate(datasets.items()):
            info = write_corpus(
                root,
                {dataset: files},
                docs_per_file=max(8, int(docs * scale)),
                mean_length=mean,
                spread=sigma,
                seed=i + 1,
                first_token=first,
            )
            first = info.ranges[dataset][1]
        index_root(root, ArrowDocHandler(), workers=2)
        open(marker, "w").close()
    tokens = docs = 0
    for directory, _, names in os.walk(root):
        for file in names:
            if file.endswith(".arrow"):
                handler = ArrowDocHandler()
                n_docs, n_tokens = handler.count(os.path.join(directory, file))
                tokens, docs = tokens + n_tokens, docs + n_docs
    return {"tokens": tokens, "documents": docs, "mean_document": tokens / max(1, docs)}


def bare_read(root: str, seconds: float) -> float:
    """Tokens/s of reading consecutive windows of the shard files into int64 tensors."""
    line = SEQ + 1
    paths = sorted(
        os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".arrow")
    )
    tokens = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for path in paths:
            size = os.path.getsize(path) // 4
            data = np.memmap(path, dtype=np.uint32, mode="r", shape=(size,))
            for at in range(0, size - line, line):
                torch.from_numpy(data[at : at + line].astype(np.int64))
                tokens += line - 1
            if time.perf_counter() - start > seconds:
                break
    return tokens / (time.perf_counter() - start)


def shuffled_read(root: str, seconds: float, seed: int = 0) -> float:
    """Tokens/s of reading each file's documents in a random order: every token gathered
    through an index of its position built beforehand (not timed), into int64. No loader
    logic at all: the memory cost of reading shuffled documents, which a sequential bare read
    does not pay (each document starts at a random place, so its first cache lines and page
    miss). One file at a time, so kinder to the TLB than a loader interleaving shards."""
    handler = ArrowDocHandler()
    rng = np.random.default_rng(seed)
    paths = sorted(
        os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".arrow")
    )
    tokens, spent = 0, 0.0
    while spent < seconds:
        for path in paths:
            reader = handler.open(path)
            n = handler.num_docs(reader)
            handler.doc_lengths(reader, np.arange(n))  # locates every document
            flat, starts, lengths = handler.token_buffer(reader)
            order = rng.permutation(n)
            order = order[lengths[order] > 0]
            firsts, lengths = starts[order], lengths[order]
            heads = np.cumsum(lengths) - lengths
            positions = np.arange(int(lengths.sum()), dtype=np.int64)
            positions += np.repeat(firsts - heads, lengths)
            start = time.perf_counter()
            torch.from_numpy(flat[positions].astype(np.int64))
            spent += time.perf_counter() - start
            tokens += len(positions)
            handler.close(reader)
            if spent > seconds:
                break
    return tokens / spent


def pipeline_rate(config: dict[str, Any], batches: int) -> dict[str, float]:
    """Steady tokens/s of a loader, and the main process's CPU seconds per token."""
    loader = build_dataloader(config)
    iterator = iter(loader)
    for _ in range(WARMUP):
        next(iterator)
    tokens = 0
    cpu = time.process_time()
    start = time.perf_counter()
    for _ in range(batches):
        tokens += next(iterator)["input_ids"].numel()
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu
    out = {"tokens_per_s": tokens / wall, "main_cpu_s_per_token": cpu / tokens}
    memory = [worker_memory(pid) for pid in loader.worker_pids()]
    if memory and all(m is not None for m in memory):  # Linux
        for field in ("rss_anon_mb", "private_dirty_mb"):
            out[f"worker_{field}"] = max(m[field] for m in memory)  # type: ignore[index]
    del iterator
    return out


def worker_memory(pid: int) -> dict[str, float] | None:
    """A worker's anonymous resident memory (``RssAnon``: every anonymous page it maps,
    including those it still shares copy-on-write with the main process it was forked
    from) and the part only it holds (``Private_Dirty``), in MB; None off Linux."""
    try:
        with open(f"/proc/{pid}/status") as status:
            anon = next(int(line.split()[1]) for line in status if line.startswith("RssAnon:"))
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            dirty = next(
                int(line.split()[1]) for line in rollup if line.startswith("Private_Dirty:")
            )
    except (OSError, StopIteration):
        return None
    return {"rss_anon_mb": anon / 1024, "private_dirty_mb": dirty / 1024}


def gpu_transfer(config: dict[str, Any], batches: int) -> dict[str, float]:
    """A training loop's view of the host-to-GPU hand-over, with and without ``pin_memory``.

    Per batch: the wait for ``next()`` (the batch's availability), then the time from its
    availability to its tensors on the GPU: ``.to("cuda", non_blocking=True)`` for every
    tensor and a wait on the stream (pinned memory: an asynchronous DMA; pageable memory:
    CUDA stages it through its own pinned buffer). Median and 99th percentile in seconds,
    whether the handed-out tensors were pinned and whether both gave the same batches
    (digest of the first 64 timed ones). The training thread does nothing else,
    so the waits show what the side thread that pins does not hide.
    """
    device = torch.device("cuda")
    out: dict[str, float] = {}
    digests = []
    for label, pin in (("pinned", True), ("pageable", False)):
        digest = hashlib.sha256()
        loader = build_dataloader({**config, "pin_memory": pin})
        iterator = iter(loader)
        for _ in range(WARMUP):
            next(iterator)
        waits, copies, pinned = [], [], True
        for _ in range(batches):
            start = time.perf_counter()
            batch = next(iterator)
            ready = time.perf_counter()
            on_gpu = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            torch.cuda.current_stream().synchronize()
            copies.append(time.perf_counter() - ready)
            waits.append(ready - start)
            pinned = pinned and all(v.is_pinned() for v in batch.values())
            if len(waits) <= 64:  # the first batches, to check both ways give the same
                for key in sorted(batch):
                    digest.update(batch[key].numpy().tobytes())
            del on_gpu
        del iterator
        for name, values in (("wait", waits), ("to_gpu", copies)):
            ordered = sorted(values)
            out[f"{label}_{name}_median_s"] = statistics.median(ordered)
            out[f"{label}_{name}_p99_s"] = ordered[int(0.99 * (len(ordered) - 1))]
        out[f"{label}_handed_out_pinned"] = float(pinned)
        digests.append(digest.hexdigest())
    out["same_batches"] = float(digests[0] == digests[1])
    out["batch_bytes"] = float(sum(v.numel() * v.element_size() for v in batch.values()))
    return out


def state_cost(config: dict[str, Any], directory: str) -> dict[str, float]:
    """Size and save time of one rank's loader state file with the buffers full."""
    loader = build_dataloader(config)
    iterator = iter(loader)
    for _ in range(STATE_AT):
        next(iterator)
    saves = []
    for _ in range(5):
        start = time.perf_counter()
        path = save_loader_state(loader, directory)
        saves.append(time.perf_counter() - start)
    snapshot = loader.snapshot()
    buffers = [
        stage_state(e["state"], snapshot["fingerprint"], "shuffle") for e in snapshot["shards"]
    ]
    lines = sum(len(b["buffer"]["offsets"]) - 1 for b in buffers if b is not None)
    del iterator
    return {
        "state_bytes": os.path.getsize(path),
        "buffered_lines": lines,
        "save_s": statistics.median(saves),
    }


def loader_config(name: str, root: str) -> dict[str, Any]:
    """The loader config every row of corpus ``name`` (written under ``root``) starts from."""
    datasets, weights = CORPORA[name]
    return dict(
        data_path=root,
        datasets=list(datasets),
        weights=weights,
        seq_length=SEQ,
        batch_size=BATCH,
        logical_shards=CORPUS_SHARDS.get(name, SHARDS),
        shuffle_window=WINDOW,
        eos_token=2,
    )


def measure_corpus(
    name: str, root: str, workers: list[int], batches: int, seconds: float, repeat: int
) -> dict[str, Any]:
    base = loader_config(name, root)
    runs: dict[str, list[dict[str, float]]] = {}
    settings = [("in_process", {"num_workers": 0})]
    settings += [(f"{w}_workers", {"num_workers": w}) for w in workers]
    if torch.cuda.is_available():  # pinned batches: a copy out of the ring per batch
        settings += [
            (f"{w}_workers_pinned", {"num_workers": w, "pin_memory": True}) for w in workers
        ]
    for _ in range(repeat):
        shuffled = shuffled_read(root, seconds)  # a property of the files: once per round
        for key, overrides in settings:
            bare = bare_read(root, seconds)
            figures = pipeline_rate({**base, **overrides}, batches)
            figures["bare_tokens_per_s"] = bare
            figures["ratio"] = figures["tokens_per_s"] / bare
            figures["shuffled_tokens_per_s"] = shuffled
            figures["ratio_to_shuffled"] = figures["tokens_per_s"] / shuffled
            runs.setdefault(key, []).append(figures)
    out: dict[str, Any] = {"rows": {}}
    for key, figures in runs.items():
        out["rows"][key] = {
            field: statistics.median(f[field] for f in figures) for field in figures[0]
        }
    if torch.cuda.is_available():
        out["gpu_transfer"] = gpu_transfer({**base, "num_workers": workers[0]}, batches // 3)
    with tempfile.TemporaryDirectory() as scratch:
        out["state"] = state_cost({**base, "num_workers": 0}, scratch)
    return out


def print_table(results: dict[str, Any]) -> None:
    head = (
        f"{'corpus':8} {'row':22} {'bare M/s':>9} {'M tok/s':>8} {'ratio':>6} "
        f"{'shuf M/s':>8} {'vs shuf':>7} {'us/doc':>7} {'main ns/tok':>11} {'core@100M':>9}"
    )
    print("\n" + head)
    print("-" * len(head))
    for name, corpus in results["corpora"].items():
        mean_doc = corpus["counts"]["mean_document"]
        for key, row in corpus["rows"].items():
            rate = row["tokens_per_s"]
            per_doc = mean_doc / rate * 1e6
            main = row["main_cpu_s_per_token"]
            print(
                f"{name:8} {key:22} {row['bare_tokens_per_s'] / 1e6:9.0f} {rate / 1e6:8.1f} "
                f"{row['ratio']:6.2f} {row['shuffled_tokens_per_s'] / 1e6:8.0f} "
                f"{row['ratio_to_shuffled']:7.2f} {per_doc:7.2f} {main * 1e9:11.2f} "
                f"{main * 1e8:9.0%}"
            )
        transfer = corpus.get("gpu_transfer")
        if transfer:
            print(
                f"{name:8} {'to GPU, 1 worker':22} "
                + ", ".join(
                    f"{label}: wait {transfer[label + '_wait_median_s'] * 1e6:.0f} us, "
                    f"copy {transfer[label + '_to_gpu_median_s'] * 1e6:.0f} us "
                    f"(p99 {transfer[label + '_to_gpu_p99_s'] * 1e6:.0f})"
                    for label in ("pinned", "pageable")
                )
                + f" per {transfer['batch_bytes'] / 1024:.0f} KiB batch"
                + ("" if transfer["same_batches"] else "; PINNED BATCHES DIFFER")
            )
        with_memory = [k for k, row in corpus["rows"].items() if "worker_rss_anon_mb" in row]
        if with_memory:
            row = corpus["rows"][with_memory[0]]
            print(
                f"{name:8} {'worker memory':22} {with_memory[0]}: RssAnon "
                f"{row['worker_rss_anon_mb']:.0f} MB, of it private "
                f"{row['worker_private_dirty_mb']:.0f} MB (after {WARMUP} + the timed batches)"
            )
        state = corpus["state"]
        print(
            f"{name:8} {'state':22} {state['state_bytes'] / 1024:.0f} KiB at "
            f"{state['buffered_lines']} buffered lines, save {state['save_s'] * 1e3:.1f} ms"
        )


def chart(results: dict[str, Any], path: str) -> None:
    """Bars of the ratio to the bare read, per corpus and row; skipped without matplotlib."""
    plt = pyplot(path)
    if plt is None:
        return
    names = list(results["corpora"])
    keys = list(results["corpora"][names[0]]["rows"])
    width = 0.8 / len(keys)
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, key in enumerate(keys):
        values = [results["corpora"][n]["rows"][key]["ratio"] for n in names]
        ax.bar(
            [x + (i - (len(keys) - 1) / 2) * width for x in range(len(names))],
            values,
            width,
            label=key.replace("_", " "),
        )
    ceiling = [
        statistics.median(
            row["shuffled_tokens_per_s"] / row["bare_tokens_per_s"]
            for row in results["corpora"][n]["rows"].values()
        )
        for n in names
    ]
    ax.scatter(
        range(len(names)),
        ceiling,
        marker="_",
        s=900,
        color="black",
        zorder=3,
        label="shuffled bare read",
    )
    ax.axhline(0.5, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("tokens/s / bare memmap read")
    machine = results["machine"]
    ax.set_title(f"fmsdata throughput vs a bare read ({machine['cpus']} CPUs)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small corpora, short timings")
    parser.add_argument("--workers", default="1", help="worker counts to time, e.g. 1,2,4,8")
    parser.add_argument("--corpora", default=",".join(CORPORA), help="corpora to run")
    parser.add_argument("--repeat", type=int, default=None, help="runs per row (median)")
    parser.add_argument("--data", default=DATA)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "throughput.json"))
    parser.add_argument("--chart", default=os.path.join(HERE, "throughput.png"))
    parser.add_argument(
        "--prepare", action="store_true", help="write the corpora under --data, then stop"
    )
    args = parser.parse_args()

    scale = 0.1 if args.quick else 1.0
    batches, seconds = (300, 1.0) if args.quick else (1500, 2.0)
    repeat = args.repeat or (1 if args.quick else 3)
    workers = [int(w) for w in args.workers.split(",") if w]
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        },
        "settings": {
            "seq_length": SEQ,
            "batch_size": BATCH,
            "logical_shards": SHARDS,
            "shuffle_window": WINDOW,
            "timed_batches": batches,
            "repeat": repeat,
        },
        "corpora": {},
    }
    for name in args.corpora.split(","):
        root = os.path.join(args.data, f"{name}-{scale}")
        counts = ensure_corpus(root, name, scale)
        if args.prepare:
            continue
        print(f"measuring {name} ({counts['tokens'] / 1e6:.0f} M tokens) ...", flush=True)
        figures = measure_corpus(name, root, workers, batches, seconds, repeat)
        results["corpora"][name] = {"counts": counts, **figures}
        write_results(args.out, results)  # after each corpus: a cut-short run keeps them
    if args.prepare:
        os.sync()  # written pages reach the disk before anything is timed
        return 0
    print_table(results)
    chart(results, args.chart)
    return 0


if __name__ == "__main__":
    sys.exit(main())
