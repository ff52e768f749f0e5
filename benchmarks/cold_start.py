"""Cold start: seconds from a fresh process to ``import torch``, ``import fmsdata`` and the
first batch, with numba's on-disk cache empty (a fresh install, a container started anew)
and warm (the next process on the same machine), for each way ``fmsdata.util.compiled`` serves a
kernel's first calls.

Each figure comes from a new Python process, timed from its first line, over a small local
root (generated Arrow files in two datasets, the default stages, ``num_workers=0`` so the
batch is made in the process being timed). "cold" points ``NUMBA_CACHE_DIR`` at an empty
folder; "warm" runs again on the folder the cold run filled; "warmed" fills an empty folder
with ``fmsdata warm`` first, as a container build would. ``FMSDATA_COMPILE=foreground``
compiles each kernel on its first call (what fmsdata did before the background compile);
``background`` (the default) runs first calls in Python while a thread compiles. "next 50"
is the seconds the 50 batches after the first take (in Python while the compile goes on).
The kernels compiled in those 51 batches (foreground, cold) are listed with the
seconds of each one's first call (its compile, and the compiles of the kernels it calls).
Each row runs ``--repeats`` times and keeps the least seconds: on a shared machine the
others' load only ever adds time.

    python benchmarks/cold_start.py
    python benchmarks/cold_start.py --repeats 5

Prints a table and writes ``benchmarks/results/cold_start.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from benchlib import write_results

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS = (
    "cold foreground",
    "warm foreground",
    "cold background",
    "warm background",
    "warmed background",
)

# Run in a fresh interpreter: timings from its first line; the kernels' first calls timed
# by wrapping fmsdata.util.compiled's lazy function (each first call compiles it).
PROBE = r"""
import time
started = time.perf_counter()
import json, sys
import torch
after_torch = time.perf_counter()
import fmsdata
after_fmsdata = time.perf_counter()
from fmsdata.util import compiled as _compiled
first_calls = {}
_call = _compiled._Compiled.__call__
def _timed(self, *args):
    if self.ready is not None:
        return _call(self, *args)
    begun = time.perf_counter()
    try:
        return _call(self, *args)
    finally:
        key = f"{self.__module__}.{self.__name__}"
        first_calls.setdefault(key, time.perf_counter() - begun)
_compiled._Compiled.__call__ = _timed
config = json.loads(sys.argv[1])
loader = fmsdata.build_dataloader(config)
batches = iter(loader)
batch = next(batches)
first_batch = time.perf_counter()
assert batch["input_ids"].shape == (config["batch_size"], config["seq_length"])
for _ in range(50):
    next(batches)
print(json.dumps({
    "next_50_s": time.perf_counter() - first_batch,
    "import_torch_s": after_torch - started,
    "import_fmsdata_s": after_fmsdata - after_torch,
    "first_batch_s": first_batch - started,
    "build_and_batch_s": first_batch - after_fmsdata,
    "kernels": first_calls,
}))
"""


def make_root(root: str) -> str:
    from fmsdata.data.synthetic import write_corpus

    write_corpus(root, {"web": 4, "code": 4}, docs_per_file=50, mean_length=400)
    return root


def probe(config: dict[str, Any], cache_dir: str, mode: str) -> dict[str, Any]:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir, "OMP_NUM_THREADS": "1"}
    env["FMSDATA_COMPILE"] = mode
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(config)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"the probe failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def warm(cache_dir: str, config_path: str) -> None:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir}
    command = [sys.executable, "-m", "fmsdata.cli.main", "warm", config_path]
    subprocess.run(command, env=env, check=True, capture_output=True)


def least(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's least over the repeats (kernel times from the fastest first batch)."""
    best = min(rows, key=lambda row: row["first_batch_s"])
    out = {k: min(row[k] for row in rows) for k in rows[0] if k != "kernels"}
    out["kernels"] = best["kernels"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0, help="num_workers of the loader")
    parser.add_argument("--no-warm-command", action="store_true", help="skip the warmed row")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "cold_start.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="fmsdata-coldstart-") as scratch:
        config = {
            "data_path": make_root(os.path.join(scratch, "data")),
            "seq_length": 512,
            "batch_size": 8,
            "logical_shards": 8,
            "bos_token": 1,
            "eos_token": 2,
            "num_workers": args.workers,
        }
        config_path = os.path.join(scratch, "loader.json")
        with open(config_path, "w") as handle:
            json.dump(config, handle)
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in ROWS}
        for repeat in range(args.repeats):
            for mode in ("foreground", "background"):
                cache = os.path.join(scratch, f"numba-{mode}-{repeat}")
                rows[f"cold {mode}"].append(probe(config, cache, mode))  # an empty cache
                rows[f"warm {mode}"].append(probe(config, cache, mode))  # the one it filled
            if not args.no_warm_command:
                warmed = os.path.join(scratch, f"warmed-{repeat}")
                warm(warmed, config_path)
                rows["warmed background"].append(probe(config, warmed, "background"))
    results: dict[str, Any] = {name: least(found) for name, found in rows.items() if found}
    results["config"] = {k: v for k, v in config.items() if k != "data_path"}
    results["cpus"] = os.cpu_count()

    print(
        f"{'':20}{'import torch':>14}{'+ fmsdata':>11}{'first batch':>13}{'next 50':>9}"
        f"   (s, least of {args.repeats}, from the process's first line)"
    )
    for name in ROWS:
        if name in results:
            row = results[name]
            print(
                f"{name:20}{row['import_torch_s']:>14.2f}{row['import_fmsdata_s']:>11.2f}"
                f"{row['first_batch_s']:>13.2f}{row['next_50_s']:>9.2f}"
            )
    print("\nkernels compiled in the first 51 batches, cold foreground (s of each first call):")
    kernels = results["cold foreground"]["kernels"]
    for name, seconds in sorted(kernels.items(), key=lambda kv: -kv[1]):
        print(f"  {seconds:6.2f}  {name}")
    write_results(args.out, results)


if __name__ == "__main__":
    main()
