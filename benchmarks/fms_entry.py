"""fms-fsdp's entry point: the default ``[causal_lm]`` written by the workers, against the
same chain run on each line.

    python benchmarks/fms_entry.py [--corpora short,doc60] [--workers 1] [--batches 1500]

``fmsdata.compat.fms_fsdp.get_data_loader(cfg, rank, world)`` with the default postprocess
has the workers write fms-fsdp's int32 ``(input, label)`` batches into the shared batch
ring (``output_dtype="int32"``, ``ignore_first_labels=1``). The baseline, measured in the
same run on the same corpora (``benchmarks/throughput.py``'s, written once under its data
folder), is ``postprocess=[causal_lm, unchanged]``: the same batches (checked, digest of
the first timed ones), made by calling the chain on every line, as any other postprocess
is. Per row: tokens/s and the main process's CPU a batch. Prints a table, writes JSON and
a chart.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import throughput  # noqa: E402
from benchlib import pyplot, write_results  # noqa: E402

from fmsdata.compat.fms_fsdp import causal_lm, get_data_loader  # noqa: E402

WARMUP = 300
DIGESTED = 64


def unchanged(pair: Any) -> Any:
    """A step after ``causal_lm`` that changes nothing: the chain then runs per line."""
    return pair


def fms_config(root: str, workers: int, scratch: str) -> dict[str, Any]:
    """fms-fsdp's ``train_config`` fields for a throughput corpus (as its loader config)."""
    datasets, weights = throughput.CORPORA[os.path.basename(root).split("-")[0]]
    return dict(
        data_path=root,
        datasets=",".join(datasets),
        weights=",".join(str(int(w)) for w in weights),
        seq_length=throughput.SEQ,
        batch_size=throughput.BATCH,
        logical_shards=throughput.SHARDS,
        num_workers=workers,
        ckpt_save_path=scratch,
        ckpt_load_path=scratch,
        checkpoint_interval=0,
        bos_token=None,
        eos_token=2,
        file_type="arrow",
        col_name="tokens",
    )


def rate(loader: Any, batches: int) -> dict[str, Any]:
    iterator = iter(loader)
    for _ in range(WARMUP):
        next(iterator)
    digest = hashlib.sha256()
    cpu, start = time.process_time(), time.perf_counter()
    for i in range(batches):
        inputs, labels = next(iterator)
        if i < DIGESTED:
            digest.update(inputs.numpy().tobytes() + labels.numpy().tobytes())
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    tokens = batches * throughput.BATCH * throughput.SEQ
    return {"tokens_per_s": tokens / wall, "main_cpu_s_per_batch": cpu / batches,
            "digest": digest.hexdigest()}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpora", default="short,doc60")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batches", type=int, default=1500)
    parser.add_argument("--data", default=throughput.DATA)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "fms_entry.json"))
    parser.add_argument("--chart", default=os.path.join(HERE, "results", "fms_entry.png"))
    args = parser.parse_args()
    results: dict[str, Any] = {"workers": args.workers, "batches": args.batches, "corpora": {}}
    for name in args.corpora.split(","):
        root = os.path.join(args.data, f"{name}-1.0")
        throughput.ensure_corpus(root, name, 1.0)
        rows = {}
        for label, steps in (("per_line", (causal_lm, unchanged)), ("written", (causal_lm,))):
            with tempfile.TemporaryDirectory() as scratch:
                cfg = fms_config(root, args.workers, scratch)
                rows[label] = rate(get_data_loader(cfg, 0, 1, postprocess=steps), args.batches)
        rows["speedup"] = rows["written"]["tokens_per_s"] / rows["per_line"]["tokens_per_s"]
        rows["same_batches"] = rows["written"]["digest"] == rows["per_line"]["digest"]
        results["corpora"][name] = rows
    print(f"\n{'corpus':8} {'chain':9} {'M tok/s':>8} {'main us/batch':>14}")
    for name, rows in results["corpora"].items():
        for label in ("per_line", "written"):
            row = rows[label]
            print(
                f"{name:8} {label:9} {row['tokens_per_s'] / 1e6:8.0f} "
                f"{row['main_cpu_s_per_batch'] * 1e6:14.1f}"
            )
        same = "same batches" if rows["same_batches"] else "BATCHES DIFFER"
        print(f"{name:8} {'written / per line':27} {rows['speedup']:.1f}x, {same}")
    write_results(args.out, results)
    plt = pyplot(args.chart)
    if plt is not None:
        names = list(results["corpora"])
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for i, label in enumerate(("per_line", "written")):
            values = [results["corpora"][n][label]["tokens_per_s"] / 1e6 for n in names]
            ax.bar([j + 0.4 * i for j in range(len(names))], values, 0.4, label=label)
        ax.set_xticks([j + 0.2 for j in range(len(names))], names)
        ax.set_ylabel("M tokens/s")
        ax.set_title(f"fms-fsdp entry point, [causal_lm], {args.workers} worker(s)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.chart)
        print(f"wrote {args.chart}")


if __name__ == "__main__":
    main()
