"""fms-fsdp order: fmsdata's reimplementation beside fms-fsdp's own loader, same shards.

    python benchmarks/fms_order_speed.py [--steps 300] [--seq 4096] [--peers PATH]

Builds Arrow shards (one record batch per document), then runs, each in its own
subprocess, fms-fsdp mamba-new's ``get_data_loader`` and fmsdata's
``get_data_loader(order="fms-fsdp")`` on one rank with 0 DataLoader workers (so tokens/s
is per worker), checks that every batch digest is equal, and measures tokens/s, the size
of the loader state written at the last step, and the time to write it. Prints a table
and writes ``benchmarks/measured/fms_order_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pyarrow as pa

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def make_shards(root: str, n_docs: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    schema = pa.schema([("tokens", pa.uint32())])
    for name in ("lang=en/dataset=web", "code"):
        for f in range(4):
            path = os.path.join(root, name, f"part-{f}.arrow")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with pa.ipc.new_file(path, schema) as w:
                for _ in range(n_docs):
                    n = int(rng.integers(50, 3000))
                    doc = rng.integers(10, 50000, n, dtype=np.uint32)
                    w.write_batch(pa.record_batch([pa.array(doc)], schema=schema))


CHILD = r"""
import hashlib, json, os, sys, time, types
which, data, save, steps, seq, peers = sys.argv[1:7]
steps, seq = int(steps), int(seq)
cfg = dict(data_path=data, datasets="lang=en/dataset=web,code", weights="3,1",
           seq_length=seq, batch_size=8, logical_shards=16, seed=2023, eos_token=0,
           bos_token=None, file_type="auto", col_name="tokens", num_workers=0,
           checkpoint_interval=steps, ckpt_save_path=save, ckpt_load_path=save)
if which == "fms-fsdp":
    sys.modules.setdefault("transformers", types.ModuleType("transformers"))
    stub = staticmethod(lambda *a, **k: None)  # never called on Arrow shards
    sys.modules["transformers"].AutoTokenizer = type("T", (), {"from_pretrained": stub})
    sys.path.insert(0, os.path.join(peers, "mamba-new"))
    from fms_fsdp.config import train_config
    from fms_fsdp.utils.dataloader_utils import get_data_loader
    c = train_config()
    for k, v in cfg.items():
        setattr(c, k, v)
    loader = get_data_loader(c, 0, 1)
else:
    from fmsdata.compat.fms_fsdp import get_data_loader
    loader = get_data_loader(cfg, 0, 1, order="fms-fsdp")
h = hashlib.sha256()
it = iter(loader)
t0 = time.perf_counter()
for _ in range(steps):
    x, y = next(it)
    h.update(x.numpy().tobytes()); h.update(y.numpy().tobytes())
t1 = time.perf_counter()
next(it)  # the state of step `steps` is written when the next batch starts
t2 = time.perf_counter()
sizes = [os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(save) for f in fs]
print(json.dumps({"seconds": t1 - t0, "tokens": steps * 8 * (seq + 1), "digest": h.hexdigest(),
                  "state_bytes": sum(sizes), "save_and_batch_s": t2 - t1}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--docs", type=int, default=2000)
    peers = os.path.join(ROOT, "..", "shared", "peers", "fms-fsdp")
    parser.add_argument("--peers", default=os.path.normpath(peers))
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        make_shards(data, args.docs)
        for which in ("fms-fsdp", "fmsdata"):
            save = os.path.join(tmp, which)
            cmd = [sys.executable, "-c", CHILD, which, data, save, str(args.steps)]
            cmd += [str(args.seq), args.peers]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
            results[which] = json.loads(out.stdout.strip().splitlines()[-1])
    same = results["fms-fsdp"]["digest"] == results["fmsdata"]["digest"]
    lines = min(args.steps * 8, 10000)
    print(f"{args.steps} steps x 8 x {args.seq + 1} tokens, {lines} lines buffered; same: {same}")
    print(f"{'loader':10} {'tokens/s':>12} {'state MB':>10} {'save+batch s':>13}")
    for which, r in results.items():
        r["tokens_per_s"] = r["tokens"] / r["seconds"]
        print(
            f"{which:10} {r['tokens_per_s']:12,.0f} {r['state_bytes'] / 1e6:10.1f} "
            f"{r['save_and_batch_s']:13.2f}"
        )
    speedup = results["fmsdata"]["tokens_per_s"] / results["fms-fsdp"]["tokens_per_s"]
    print(f"speed-up {speedup:.1f}x")
    os.makedirs(os.path.join(HERE, "measured"), exist_ok=True)
    with open(os.path.join(HERE, "measured", "fms_order_speed.json"), "w") as f:
        json.dump({"args": vars(args), "same": same, "speedup": speedup, **results}, f, indent=1)


if __name__ == "__main__":
    main()
