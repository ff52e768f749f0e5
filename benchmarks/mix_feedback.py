"""The cost of a mix that follows the loss, on the main process: ``record_loss`` per step
against the step's batch fetch, measured in the same run.

One rank over a local root of generated Arrow files in two datasets (``benchlib``), the
default stages. Per row: the mean seconds of ``next(loader)`` (the batch fetch, what a
step waits for: items of many batches are made at once, so the mean is the cost a batch)
and the median of ``record_loss(batch, loss)`` over ``--steps`` steps, with the loss
per token ``[batch, seq]`` or per sequence ``[batch]`` (float32 on the CPU, as after
``.detach()``), and their ratio; the baseline row is the same loader without
``mix_policy`` (the fetch then carries no dataset pieces). ``record_loss`` here never
updates (``mix_update_every`` past the run); the "update" row runs with
``mix_update_every=--every`` and times what an update adds on the main process: the
``record_loss`` that ends an interval plus the fetches until the restarted workers are
back to the fetch of before (the chains carried over, the workers restarted, their first
small items made), less as many mean fetches, its median over the updates after the first
(which also pays first-use costs in the new workers), against the mean fetch and
amortized over the interval. Without ``torch.distributed`` no gather is
timed (a gloo or NCCL all-gather of ``2 x datasets`` float64 values is added per step).

    python benchmarks/mix_feedback.py
    python benchmarks/mix_feedback.py --workers 0 --steps 200

A warm-up run comes first (kernels compile on first use). Prints a table and writes
``benchmarks/results/mix_feedback.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import tempfile
import time
from typing import Any

import numpy as np
import torch
from benchlib import generated_documents, write_results

HERE = os.path.dirname(os.path.abspath(__file__))


def make_root(root: str) -> None:
    from fmsdata.handlers.arrow import write_arrow_docs

    if os.path.exists(os.path.join(root, "code")):
        return
    for name, files in generated_documents(files=4, docs=400).items():
        os.makedirs(os.path.join(root, name))
        for f, docs in enumerate(files):
            write_arrow_docs(os.path.join(root, name, f"part{f}.arrow"), docs, dtype=np.uint16)


def run(config: dict[str, Any], steps: int, loss_shape: str | None) -> dict[str, Any]:
    """Per step: fetch seconds, record_loss seconds (None without a loss), and whether
    the step's record ended an interval."""
    from fmsdata import build_dataloader

    loader = build_dataloader(config)
    batches = iter(loader)
    fetch, record, updated = [], [], []
    rng = np.random.default_rng(0)
    b, s = config["batch_size"], config["seq_length"]
    losses = [
        torch.from_numpy(rng.uniform(1, 5, (b, s) if loss_shape == "token" else b).astype("f4"))
        for _ in range(8)
    ]
    next(batches)  # the first batch pays the start: not a step's cost
    if loss_shape is not None:
        loader.record_loss(None, losses[0])
    for step in range(steps):
        begun = time.perf_counter()
        batch = next(batches)
        fetch.append(time.perf_counter() - begun)
        if loss_shape is None:
            continue
        before = len(loader.mix_history)
        begun = time.perf_counter()
        loader.record_loss(batch, losses[step % len(losses)])
        record.append(time.perf_counter() - begun)
        updated.append(len(loader.mix_history) > before)
    loader.close()
    return {"fetch": fetch, "record": record, "updated": updated}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="root to write (or reuse) the corpus in")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--every", type=int, default=50, help="mix_update_every, update row")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "mix_feedback.json"))
    args = parser.parse_args()
    root = args.data or tempfile.mkdtemp(prefix="fmsdata-bench-feedback-")
    make_root(root)
    base = dict(
        data_path=root,
        datasets=["web", "code"],
        weights=[1, 1],
        seq_length=2048,
        batch_size=8,
        logical_shards=8,
        shuffle_window=16,
        bos_token=1,
        eos_token=2,
        num_workers=args.workers,
    )
    never = {**base, "mix_policy": "odm", "mix_update_every": 10**9}
    # Numba compiles fmsdata's kernels on a thread while their first calls run in Python
    # (fmsdata.util.compiled): a warm-up run first, so no row pays for it.
    run({**never, "mix_update_every": 8}, 40, "token")
    rows = []
    baseline = run(base, args.steps, None)
    base_fetch = statistics.fmean(baseline["fetch"])
    rows.append(("no mix_policy", base_fetch, None))
    for shape in ("token", "sequence"):
        got = run(never, args.steps, shape)
        rows.append((f"odm, loss per {shape}", statistics.fmean(got["fetch"]), got["record"]))
    updates = run({**never, "mix_update_every": args.every}, args.steps, "token")
    fetch, record = updates["fetch"], updates["record"]
    ends = [i for i, u in enumerate(updates["updated"]) if u]
    update_cost = []
    for i, end in enumerate(ends[:-1]):
        # From the record that ends the interval to the next one: the interval's extra
        # seconds over as many fetches of the run without updates.
        span = range(end + 1, ends[i + 1] + 1)
        extra = record[end] + sum(fetch[j] for j in span) - len(span) * rows[1][1]
        update_cost.append(extra)

    print(f"{'row':<24} {'fetch ms':>9} {'record_loss ms':>15} {'record / fetch':>15}")
    results: dict[str, Any] = {
        "config": {k: v for k, v in base.items() if k != "data_path"},
        "steps": args.steps,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
            ).stdout.strip(),
        },
        "rows": [],
    }
    for name, fetch_s, record_s_all in rows:
        record_s = statistics.median(record_s_all) if record_s_all else None
        ratio = record_s / fetch_s if record_s is not None else None
        print(
            f"{name:<24} {fetch_s * 1e3:>9.3f} "
            + (f"{record_s * 1e3:>15.3f} {ratio:>15.3f}" if record_s is not None else "")
        )
        results["rows"].append(
            {"row": name, "fetch_s": fetch_s, "record_loss_s": record_s, "ratio": ratio}
        )
    if len(update_cost) > 1:
        later = statistics.median(update_cost[1:])
        fetch_s = rows[1][1]
        print(
            f"{'update every ' + str(args.every):<24} {fetch_s * 1e3:>9.3f} "
            f"{later * 1e3:>15.3f} {later / fetch_s:>15.3f}"
            f"   (an update's extra seconds; first update {update_cost[0]:.2f} s; "
            f"amortized over the interval: {later / (fetch_s * args.every):.2f} x the fetch)"
        )
        results["rows"].append(
            {
                "row": f"update every {args.every}",
                "fetch_s": fetch_s,
                "update_s": later,
                "first_update_s": update_cost[0],
                "updates": len(update_cost),
                "ratio": later / fetch_s,
                "amortized_ratio": later / (fetch_s * args.every),
            }
        )
    write_results(args.out, results)


if __name__ == "__main__":
    main()
