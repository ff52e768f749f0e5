"""Resume against fresh start: seconds to the first batch, by number of files and shards.

One rank owning every logical shard over a local root of generated one-batch-per-document
Arrow files in two datasets (with ``meta/counts.csv``). Per (files, logical shards): a
fresh loader's seconds to its first batch; then a run of ``--steps`` batches is saved and a
new loader (in a fresh process, so nothing is cached) loads the state and takes its first
batch; its seconds, the CPU seconds of the process, the readers it opened and its peak RSS.
A resume should cost at most 3x a fresh start (+1 s): O(files + owned shards), never
O(files x shards). Each measurement runs ``--repeats`` times, fresh and resume in turn, and
keeps the least seconds: on a shared machine the others' load only ever adds time.

    python benchmarks/resume.py                       # 2,000 and 20,000 files x 64, 1,024 shards
    python benchmarks/resume.py --files 2000 --shards 64,256
    python benchmarks/resume.py --quick

Prints a table, writes ``benchmarks/results/resume.json`` and the chart beside it
(``--chart``; needs matplotlib).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
from benchlib import pyplot, write_results

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS_PER_FILE = 64


def make_root(root: str, files: int) -> None:
    """``files`` Arrow files (half per dataset) of ``DOCS_PER_FILE`` documents, counted."""
    from fmsdata.data.indexing import index_root
    from fmsdata.handlers import ArrowDocHandler
    from fmsdata.handlers.arrow import write_arrow_docs

    if os.path.exists(os.path.join(root, "meta", "counts.csv")):
        return
    rng = np.random.default_rng(0)
    for name in ("web", "code"):
        folder = os.path.join(root, name)
        os.makedirs(folder, exist_ok=True)
        for f in range(files // 2):
            lengths = np.maximum(1, rng.lognormal(np.log(100), 1.0, DOCS_PER_FILE)).astype(int)
            tokens = rng.integers(16, 50_000, int(lengths.sum()), dtype=np.uint16)
            docs = np.split(tokens, np.cumsum(lengths)[:-1])
            write_arrow_docs(os.path.join(folder, f"part_{f:05d}.arrow"), docs, dtype=np.uint16)
    index_root(root, ArrowDocHandler(), workers=2)


def config(root: str, shards: int) -> dict[str, Any]:
    return dict(
        data_path=root,
        datasets=["web", "code"],
        weights=[0.7, 0.3],
        seq_length=1024,
        batch_size=8,
        logical_shards=shards,
        shuffle_window=16,
        bos_token=0,
        eos_token=1,
        num_workers=0,
    )


def peak_rss() -> int:
    """This process's peak resident bytes: ``VmHWM``, which starts afresh at exec (the
    ``ru_maxrss`` of a child also counts the parent it was forked from)."""
    import resource

    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(args: argparse.Namespace) -> None:
    """One measurement in this (fresh) process; prints JSON."""
    import warnings

    warnings.simplefilter("ignore")
    from fmsdata import build_dataloader
    from fmsdata.handlers.arrow import ArrowDocHandler

    opened = [0]
    open_ = ArrowDocHandler.open

    def counted(self: Any, path: str) -> Any:
        opened[0] += 1
        return open_(self, path)

    ArrowDocHandler.open = counted  # type: ignore[method-assign]
    cfg = config(args.root, args.shards)
    state = None
    if args.state:
        import torch

        state = torch.load(args.state, weights_only=True)
    start, cpu = time.perf_counter(), time.process_time()
    loader = build_dataloader(cfg)
    if state is not None:
        loader.load_state_dict(state)
    next(iter(loader))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    rss = peak_rss()
    print(json.dumps({"seconds": seconds, "cpu": cpu, "opened": opened[0], "rss": rss}))


def save_state(root: str, shards: int, steps: int, path: str) -> None:
    import warnings

    import torch

    warnings.simplefilter("ignore")
    from fmsdata import build_dataloader

    loader = build_dataloader(config(root, shards))
    batches = iter(loader)
    for _ in range(steps):
        next(batches)
    torch.save(loader.state_dict(), path)


def measure(root: str, shards: int, state: str | None) -> dict[str, float]:
    """One fresh process's measurement (``child``)."""
    command = [sys.executable, __file__, "--child", "--root", root, "--shards", str(shards)]
    if state:
        command += ["--state", state]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def chart(rows: list[dict[str, Any]], path: str) -> None:
    plt = pyplot(path)
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [f"{r['files']:,} files\n{r['shards']} shards" for r in rows]
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["fresh_s"] for r in rows], 0.4, label="fresh start")
    ax.bar(x + 0.2, [r["resume_s"] for r in rows], 0.4, label="resume")
    ax.set_xticks(x, labels)
    ax.set_ylabel("seconds to first batch")
    ax.set_title("Resume vs fresh start (one rank owning every logical shard)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", default="2000,20000", help="comma list of file counts")
    parser.add_argument("--shards", default="64,1024", help="comma list of logical shards")
    parser.add_argument("--steps", type=int, default=100, help="batches before the save")
    parser.add_argument("--quick", action="store_true", help="2,000 files x 64, 256 shards")
    parser.add_argument("--scratch", default=None, help="where roots are generated (kept)")
    parser.add_argument("--repeats", type=int, default=3, help="runs kept at their least")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "resume.json"))
    parser.add_argument("--chart", default=None, help="PNG path (default: beside --out)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.shards = int(args.shards)
        child(args)
        return 0
    if args.quick:
        args.files, args.shards = "2000", "64,256"
    scratch = args.scratch or tempfile.mkdtemp(prefix="fmsdata-resume-")
    rows = []
    print(
        f"{'files':>8} {'shards':>7} {'fresh s':>8} {'resume s':>9} {'target s':>9} "
        f"{'resume cpu':>10} {'opened':>7} {'resume RSS':>11}"
    )
    for files in (int(v) for v in args.files.split(",")):
        root = os.path.join(scratch, f"root{files}")
        start = time.perf_counter()
        make_root(root, files)
        made = time.perf_counter() - start
        for shards in (int(v) for v in args.shards.split(",")):
            state = os.path.join(scratch, f"state{files}_{shards}.pt")
            save_state(root, shards, args.steps, state)
            runs: dict[str, list[dict[str, float]]] = {"fresh": [], "resume": []}
            for _ in range(max(1, args.repeats)):
                runs["fresh"].append(measure(root, shards, None))
                runs["resume"].append(measure(root, shards, state))
            fresh = {k: min(r[k] for r in runs["fresh"]) for k in runs["fresh"][0]}
            resumed = {k: min(r[k] for r in runs["resume"]) for k in runs["resume"][0]}
            target = 3 * fresh["seconds"] + 1
            row = {
                "files": files,
                "shards": shards,
                "fresh_s": fresh["seconds"],
                "resume_s": resumed["seconds"],
                "target_s": target,
                "meets_target": resumed["seconds"] <= target,
                "ratio": resumed["seconds"] / fresh["seconds"],
                "fresh_cpu_s": fresh["cpu"],
                "resume_cpu_s": resumed["cpu"],
                "resume_opened": resumed["opened"],
                "fresh_opened": fresh["opened"],
                "resume_rss_mb": max(r["rss"] for r in runs["resume"]) / 2**20,
                "fresh_rss_mb": max(r["rss"] for r in runs["fresh"]) / 2**20,
                "generate_s": made,
                "runs": runs,
            }
            rows.append(row)
            print(
                f"{files:>8,} {shards:>7} {row['fresh_s']:>8.2f} {row['resume_s']:>9.2f} "
                f"{target:>9.2f} {row['resume_cpu_s']:>10.2f} {row['resume_opened']:>7} "
                f"{row['resume_rss_mb']:>8.0f} MB",
                flush=True,
            )
    write_results(
        args.out,
        {
            "steps": args.steps,
            "docs_per_file": DOCS_PER_FILE,
            "repeats": args.repeats,
            "rows": rows,
        },
    )
    chart(rows, args.chart or os.path.splitext(args.out)[0] + ".png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
