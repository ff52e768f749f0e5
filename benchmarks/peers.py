"""fmsdata beside the peer loaders: the same generated tokens, the same run, the same machine.

One corpus of generated documents (log-normal lengths, median 600, mean 1,500 tokens; EOS
after each) is written once as Arrow shards (fmsdata's and fms-fsdp's format) and converted,
untimed, by each peer's own writer to its native form:

- ``flat/``: raw uint32 token files (documents with EOS, concatenated), the ``.npy`` token
  files OLMo-core memory-maps; also read by the torchdata nodes pipeline and the bare read;
- ``mds-<seq>/``: Mosaic streaming MDS shards written by its ``MDSWriter``, one sample per
  ``seq_length + 1``-token window of the concatenated tokens (llm-foundry's layout);
- ``litdata-<seq>/``: LitData chunks written by ``litdata.optimize`` with its ``TokensLoader``
  (litgpt's layout).

Each loader then runs in a fresh subprocess per worker count, shuffled, batch 8:

- ``bare``: sequential ``seq_length + 1``-token windows of the flat files, memory-mapped and
  copied into int64 tensors (no logic at all): the baseline of every ratio;
- ``fmsdata``: ``build_dataloader`` over the Arrow shards (64 logical shards, its default
  shuffle buffer of 160 lines per shard, packing, EOS, causal-LM shift);
- ``fms-fsdp``: its ``get_data_loader`` (branch mamba-new, imported by ``sys.path`` from
  ``--fms-fsdp``) over the same Arrow shards, 64 logical shards, its fixed 10,000-line
  shuffle buffer;
- ``mosaic``: ``StreamingDataset`` (shuffled) + ``StreamingDataLoader`` over the MDS shards;
- ``litdata``: ``StreamingDataset`` (shuffled, ``TokensLoader``) + ``StreamingDataLoader``;
- ``torchdata``: a ``torchdata.nodes`` graph: ``SamplerWrapper(RandomSampler)`` over window
  indices, ``Batcher``, a batch reader (``Mapper``, or ``ParallelMapper`` in worker
  processes), ``Prefetcher``, ``Loader``;
- ``olmo-core``: ``NumpyFSLDataset`` + ``NumpyFSLDataLoader`` (shuffled global indices).

fmsdata and fms-fsdp stream documents and pack them into lines while loading (and can mix
datasets by token share); the others read fixed windows cut beforehand (Mosaic, LitData) or
at index time (OLMo-core, torchdata). Every loader delivers ``batch x seq_length`` tokens a
step; the figures count those.

Per loader and worker count: tokens/s after a warm-up that fills the shuffle buffers (as a
ratio to the bare read of the same run), time to the first batch, peak RSS of the main
process and of the largest worker, and the size and save time of the state a trainer would
checkpoint at that point (the loader's own save function where it has one, else its
``state_dict()`` written as JSON, or ``torch.save`` where it is not plain data). A peer that
cannot be imported or run gets a row with the error. Prints a table, writes
``benchmarks/results/peers.json`` and a chart (``benchmarks/results/peers.png``, needs
matplotlib); ``benchmarks/measured/`` keeps the figures the README quotes.

    pip install -c constraints.txt torch==2.13.0 -e ".[bench-peers]" \\
      && pip install -c constraints.txt --no-deps mosaicml-streaming \\
      && python benchmarks/peers.py
    python benchmarks/peers.py --quick          # small corpus, short timings
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from typing import Any

import numpy as np
from benchlib import pyplot, write_results

HERE = os.path.dirname(os.path.abspath(__file__))
FMS_FSDP = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "peers", "fms-fsdp"))
LOADERS = ("bare", "fmsdata", "fms-fsdp", "mosaic", "litdata", "torchdata", "olmo-core")
BATCH = 8
EOS = 2
SHARDS = 64  # logical shards of fmsdata and fms-fsdp
DATASET = "web"


# ---------------------------------------------------------------- corpus and conversions


def prepare(root: str, files: int, docs: int, seq: int) -> dict[str, Any]:
    """Write the Arrow corpus and each peer's copy of it (once; none of it is timed)."""
    from fmsdata.data.indexing import index_root
    from fmsdata.data.synthetic import write_corpus
    from fmsdata.handlers import ArrowDocHandler

    arrow = os.path.join(root, "arrow")
    if not os.path.exists(os.path.join(arrow, ".complete")):
        print(f"writing the Arrow corpus under {arrow} ...", flush=True)
        write_corpus(arrow, {DATASET: files}, docs_per_file=docs, mean_length=1500, spread=1.35)
        index_root(arrow, ArrowDocHandler(), workers=2)
        open(os.path.join(arrow, ".complete"), "w").close()
    flat = os.path.join(root, "flat")
    if not os.path.exists(os.path.join(flat, ".complete")):
        print(f"converting to flat token files under {flat} ...", flush=True)
        import pyarrow as pa

        os.makedirs(flat, exist_ok=True)
        for i, path in enumerate(arrow_files(arrow)):
            reader = pa.ipc.open_file(pa.memory_map(path))
            pieces = []
            for b in range(reader.num_record_batches):
                pieces.append(reader.get_batch(b).column(0).to_numpy())
                pieces.append(np.array([EOS], dtype=np.uint32))
            np.concatenate(pieces).astype(np.uint32).tofile(os.path.join(flat, f"part-{i:05d}.npy"))
        open(os.path.join(flat, ".complete"), "w").close()
    tokens = sum(os.path.getsize(p) // 4 for p in flat_files(flat))
    mds = os.path.join(root, f"mds-{seq}")
    if not os.path.exists(os.path.join(mds, ".complete")):
        try:
            print(f"converting to MDS under {mds} ...", flush=True)
            write_mds(flat, mds, seq)
            open(os.path.join(mds, ".complete"), "w").close()
        except Exception as exc:  # the row says why
            print(f"  MDS conversion failed: {type(exc).__name__}: {exc}")
    lit = os.path.join(root, f"litdata-{seq}")
    if not os.path.exists(os.path.join(lit, ".complete")):
        try:
            print(f"converting to LitData chunks under {lit} ...", flush=True)
            write_litdata(flat, lit, seq)
            open(os.path.join(lit, ".complete"), "w").close()
        except Exception as exc:
            print(f"  LitData conversion failed: {type(exc).__name__}: {exc}")
    return {"tokens": tokens, "files": files, "documents": files * docs}


def arrow_files(arrow: str) -> list[str]:
    folder = os.path.join(arrow, DATASET)
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".arrow"))


def flat_files(flat: str) -> list[str]:
    return sorted(os.path.join(flat, f) for f in os.listdir(flat) if f.endswith(".npy"))


def concatenated(flat: str) -> np.ndarray:
    return np.concatenate([np.fromfile(p, dtype=np.uint32) for p in flat_files(flat)])


def import_streaming() -> types.ModuleType:
    """mosaicml-streaming's ``streaming.base``, imported without the package ``__init__``s:
    ``streaming/__init__`` imports its vision and multimodal datasets, hence torchvision,
    whose PyPI wheel does not load beside the CPU build of torch. The text path needs none."""
    spec = importlib.util.find_spec("streaming")
    if spec is None or spec.origin is None:
        raise ImportError("No module named 'streaming' (mosaicml-streaming)")
    home = os.path.dirname(spec.origin)
    for name, sub in (("streaming", ""), ("streaming.base", "base")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [os.path.join(home, sub)]
            sys.modules[name] = package
    import streaming.base.dataloader
    import streaming.base.dataset
    import streaming.base.format.mds.writer  # noqa: F401

    return sys.modules["streaming.base"]


def write_mds(flat: str, out: str, seq: int) -> None:
    import_streaming()
    from streaming.base.format.mds.writer import MDSWriter

    tokens = concatenated(flat)
    line = seq + 1
    with MDSWriter(out=out, columns={"tokens": "ndarray:uint32"}, size_limit="64mb") as writer:
        for at in range(0, len(tokens) - line + 1, line):
            writer.write({"tokens": tokens[at : at + line]})


def _litdata_file(path: str):
    import torch

    yield torch.from_numpy(np.fromfile(path, dtype=np.uint32).astype(np.int32))


def write_litdata(flat: str, out: str, seq: int) -> None:
    from litdata import TokensLoader, optimize

    optimize(
        fn=_litdata_file,
        inputs=flat_files(flat),
        output_dir=out,
        chunk_size=(seq + 1) * 256,
        item_loader=TokensLoader(),
        num_workers=2,
        verbose=False,
    )


# ---------------------------------------------------------------- loaders (in a child)


def make_loader(name: str, root: str, seq: int, workers: int, scratch: str):
    """(iterable of batches, tokens per batch, state saver, what it reads); each state saver
    writes into ``scratch`` and returns (path, format)."""
    import torch

    flat = os.path.join(root, "flat")
    if name == "bare":
        line = seq + 1

        def bare():
            while True:
                for path in flat_files(flat):
                    data = np.memmap(path, dtype=np.uint32, mode="r")
                    batch = []
                    for at in range(0, len(data) - line + 1, line):
                        batch.append(torch.from_numpy(data[at : at + line].astype(np.int64)))
                        if len(batch) == BATCH:
                            yield batch
                            batch = []

        return bare(), None
    if name == "fmsdata":
        from fmsdata import build_dataloader
        from fmsdata.checkpoint import save_loader_state

        loader = build_dataloader(
            dict(
                data_path=os.path.join(root, "arrow"),
                datasets=[DATASET],
                weights=[1.0],
                seq_length=seq,
                batch_size=BATCH,
                logical_shards=SHARDS,
                eos_token=EOS,
                num_workers=workers,
            ),
            rank=0,
            world_size=1,
        )

        def save_fmsdata():
            return save_loader_state(loader, scratch), "fmsdata .fms file (save_loader_state)"

        return loader, save_fmsdata
    if name == "fms-fsdp":
        sys.path.insert(0, os.path.join(FMS_FSDP_ROOT, "mamba-new"))
        from fms_fsdp.config import train_config
        from fms_fsdp.utils.dataloader_utils import get_data_loader

        cfg = train_config()
        cfg.data_path = os.path.join(root, "arrow")
        cfg.datasets = DATASET
        cfg.weights = "1"
        # "arrow" fails in mamba-new's get_data_loader (`_handler_map[cfg.file_type, cols]`
        # indexes the map with a tuple holding a list: TypeError); "auto" reads .arrow files
        # with the same ArrowHandler (its tokenizer is only for Parquet files).
        cfg.file_type = "auto"
        cfg.tokenizer_path = os.path.join(scratch, "no-tokenizer")
        cfg.eos_token = EOS
        cfg.seq_length = seq
        cfg.batch_size = BATCH
        cfg.logical_shards = SHARDS
        cfg.num_workers = workers
        cfg.ckpt_load_path = cfg.ckpt_save_path = os.path.join(scratch, "fms-ckpt")
        cfg.checkpoint_interval = 10**9
        import transformers

        # AutoHandler builds a ParquetHandler, whose __init__ loads a tokenizer: none is
        # needed for Arrow shards, so hand it a placeholder rather than a download.
        transformers.AutoTokenizer.from_pretrained = lambda *a, **k: None
        import fms_fsdp.utils.dataset_utils as fms_utils

        fms_utils.AutoTokenizer.from_pretrained = lambda *a, **k: None
        loader = get_data_loader(cfg, 0, 1)
        if workers:
            return loader, None  # its state lives in the worker, which saves it itself

        def save_fms():
            path = os.path.join(scratch, "fms-state")
            loader.dataset.save_to_path(path)
            return os.path.join(path, "loader_state_0.pth"), "torch.save (its save_to_path)"

        return loader, save_fms
    if name == "mosaic":
        import_streaming()
        from streaming.base.dataloader import StreamingDataLoader
        from streaming.base.dataset import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()

        class TokenWindows(StreamingDataset):
            # llm-foundry's StreamingTextDataset does the same: tokens as int64.
            def __getitem__(self, index):
                return torch.from_numpy(super().__getitem__(index)["tokens"].astype(np.int64))

        dataset = TokenWindows(
            local=os.path.join(root, f"mds-{seq}"), shuffle=True, batch_size=BATCH
        )
        loader = StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers)
        return loader, json_saver(loader.state_dict, scratch)
    if name == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

        dataset = StreamingDataset(
            os.path.join(root, f"litdata-{seq}"),
            item_loader=TokensLoader(block_size=seq + 1),
            shuffle=True,
            drop_last=True,
        )
        loader = StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers)
        return loader, json_saver(loader.state_dict, scratch)
    if name == "torchdata":
        import torchdata.nodes as tn

        reader = WindowReader(flat_files(flat), seq + 1)
        sampler = torch.utils.data.RandomSampler(range(reader.windows))
        node: Any = tn.Batcher(tn.SamplerWrapper(sampler), batch_size=BATCH, drop_last=True)
        if workers:
            node = tn.ParallelMapper(node, reader, num_workers=workers, method="process")
        else:
            node = tn.Mapper(node, reader)
        loader = tn.Loader(tn.Prefetcher(node, prefetch_factor=2))
        return loader, json_saver(loader.state_dict, scratch)
    if name == "olmo-core":
        from olmo_core.data import DataCollator, NumpyDataLoaderBase, NumpyFSLDataset

        dataset = NumpyFSLDataset(
            *flat_files(flat),
            sequence_length=seq,
            pad_token_id=0,
            eos_token_id=EOS,
            vocab_size=2**31 - 1,
            dtype=np.uint32,
        )
        dataset.work_dir = os.path.join(scratch, "olmo-work")
        dataset.prepare()
        loader = NumpyDataLoaderBase.wrap_numpy_dataset(
            dataset,
            global_batch_size=BATCH * seq,
            collator=DataCollator(pad_token_id=0),
            work_dir=dataset.work_dir,
            num_workers=workers,
            seed=0,
        )
        loader.reshuffle(epoch=1)
        return loader, json_saver(loader.state_dict, scratch)
    raise ValueError(f"unknown loader {name!r}")


class WindowReader:
    """Index -> ``line``-token window of the flat files, as int64 (memmaps opened lazily, so
    the object pickles small to a worker process)."""

    def __init__(self, paths: list[str], line: int) -> None:
        self.paths, self.line = paths, line
        counts = [os.path.getsize(p) // 4 // line for p in paths]
        self.ends = np.cumsum(counts)
        self.windows = int(self.ends[-1])
        self._maps: list[np.memmap] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": None}

    def __call__(self, indices: list[int]):
        import torch

        if self._maps is None:
            self._maps = [np.memmap(p, dtype=np.uint32, mode="r") for p in self.paths]
        out = np.empty((len(indices), self.line), dtype=np.int64)
        for row, i in enumerate(indices):
            f = int(np.searchsorted(self.ends, i, side="right"))
            at = (i - (int(self.ends[f - 1]) if f else 0)) * self.line
            out[row] = self._maps[f][at : at + self.line]
        return torch.from_numpy(out)


def json_saver(state_dict, scratch: str):
    """State saved as a trainer would: JSON when it is plain data, else ``torch.save``."""

    def save():
        import torch

        state = state_dict()
        path = os.path.join(scratch, "state.json")
        try:
            with open(path, "w") as handle:
                json.dump(state, handle)
            return path, "JSON of state_dict()"
        except TypeError:
            path = os.path.join(scratch, "state.pt")
            torch.save(state, path)
            return path, "torch.save of state_dict() (not JSON-serializable)"

    return save


def batch_tokens(batch: Any, seq: int) -> int:
    """Input tokens in a batch: ``seq`` per line, whatever the loader's batch layout."""
    if isinstance(batch, dict):
        batch = batch["input_ids"]
    elif isinstance(batch, tuple):  # fms-fsdp: (inputs, labels)
        batch = batch[0]
    return len(batch) * seq


def peak_rss_mib(pid: int) -> float:
    """Peak resident memory of a process (VmHWM), MiB; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def descendants(pid: int) -> list[int]:
    """Processes started by ``pid`` and by those, from /proc (Linux)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                kids = [int(k) for k in handle.read().split()]
        except OSError:
            continue
        for kid in kids:
            out += [kid, *descendants(kid)]
    return out


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One loader, one worker count: warm up, time, save its state; all in this process."""
    import gc

    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        workers = int(args.workers)
        loader, saver = make_loader(args.child, args.data, args.seq, workers, scratch)
        iterator = iter(loader)
        next(iterator)
        first = time.perf_counter() - start
        for _ in range(args.warmup):
            next(iterator)
        tokens, batches = 0, 0
        start = time.perf_counter()
        while batches < args.batches and time.perf_counter() - start < args.seconds:
            tokens += batch_tokens(next(iterator), args.seq)
            batches += 1
        wall = time.perf_counter() - start
        workers_peak = max((peak_rss_mib(p) for p in descendants(os.getpid())), default=0.0)
        out: dict[str, Any] = {
            "tokens_per_s": tokens / wall,
            "timed_batches": batches,
            "first_batch_s": first,
        }
        if saver is None:
            out["state"] = None
        else:
            saves = []
            for _ in range(3):
                begin = time.perf_counter()
                path, kind = saver()
                saves.append(time.perf_counter() - begin)
            out["state"] = {
                "bytes": os.path.getsize(path),
                "save_s": statistics.median(saves),
                "format": kind,
            }
        del iterator, loader
        gc.collect()
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over an exec, so a child would report
    # the parent's peak.
    out["rss_main_mib"] = peak_rss_mib(os.getpid())
    if workers:
        # The largest process the loader started (read while it runs: some loaders' worker
        # processes are never waited for, so the kernel's children figure misses them).
        out["rss_worker_mib"] = workers_peak
    return out


# ---------------------------------------------------------------- parent


def run_child(name: str, workers: int, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, os.path.abspath(__file__), "--child", name]
    command += ["--workers", str(workers), "--data", args.data, "--seq", str(args.seq)]
    command += ["--warmup", str(args.warmup), "--batches", str(args.batches)]
    command += ["--seconds", str(args.seconds), "--fms-fsdp", args.fms_fsdp]
    # A session of its own, so that a run past the timeout is stopped with its workers.
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.communicate()
        return {"error": f"did not finish within {args.timeout} s (stopped)"}
    done = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
    cause = lines[-1] if lines else f"exit status {done.returncode}, no output"
    return {"error": cause}


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in ("torch", "mosaicml-streaming", "litdata", "torchdata", "ai2-olmo-core"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def print_table(results: dict[str, Any]) -> None:
    settings = results["settings"]
    print(
        f"\nseq_length {settings['seq_length']}, batch {BATCH}, shuffled; "
        f"{results['corpus']['tokens'] / 1e6:.0f} M tokens; {settings['rounds']} round(s), "
        "median; ratio = tokens/s / bare read of the same round"
    )
    head = (
        f"{'loader':10} {'workers':>7} {'M tok/s':>8} {'ratio':>6} {'1st batch':>9} "
        f"{'RSS main':>8} {'RSS wkr':>8} {'state':>10} {'save ms':>8}"
    )
    print(head)
    print("-" * len(head))
    for key, row in results["rows"].items():
        name, workers = key.rsplit("/", 1)
        if "error" in row:
            print(f"{name:10} {workers:>7} could not run: {row['error']}")
            continue
        for error in row.get("failed_rounds", []):
            print(f"{name:10} {workers:>7} one round failed: {error}")
        state = row.get("state")
        size = f"{state['bytes']:,}" if state else "n/a"
        save = f"{state['save_s'] * 1e3:.2f}" if state else "n/a"
        worker = f"{row['rss_worker_mib']:.0f}" if "rss_worker_mib" in row else "-"
        print(
            f"{name:10} {workers:>7} {row['tokens_per_s'] / 1e6:8.1f} {row['ratio']:6.3f} "
            f"{row['first_batch_s']:8.2f}s {row['rss_main_mib']:7.0f}M {worker:>7}M "
            f"{size:>10} {save:>8}"
        )


def chart(results: dict[str, Any], path: str) -> None:
    """Bars of tokens/s as a ratio to the bare read, per loader and worker count."""
    plt = pyplot(path)
    if plt is None:
        return
    names = [n for n in LOADERS if n != "bare"]
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, workers in enumerate(results["settings"]["workers"]):
        values = [results["rows"].get(f"{n}/{workers}", {}).get("ratio", 0.0) for n in names]
        ax.bar(
            [x + (i - 0.5) * 0.4 for x in range(len(names))],
            values,
            0.4,
            label=f"{workers} workers" if workers else "in process",
        )
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("tokens/s / bare memmap read")
    machine = results["machine"]
    ax.set_title(
        f"Peer loaders, seq {results['settings']['seq_length']}, batch {BATCH}, shuffled "
        f"({machine['cpus']} CPUs)"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small corpus, short timings")
    parser.add_argument("--seq", type=int, default=1024, help="seq_length (default 1024)")
    parser.add_argument("--workers", default="0,1", help="worker counts, e.g. 0,1")
    parser.add_argument("--loaders", default=",".join(LOADERS))
    parser.add_argument("--rounds", type=int, default=1, help="rounds (median per row)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed batches first")
    parser.add_argument("--batches", type=int, default=None, help="most timed batches")
    parser.add_argument("--seconds", type=float, default=None, help="most timed seconds")
    parser.add_argument("--timeout", type=int, default=240, help="seconds per loader run")
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "fmsdata-peers"))
    parser.add_argument("--fms-fsdp", default=FMS_FSDP, help="fms-fsdp reference checkout")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "peers.json"))
    parser.add_argument("--chart", default=os.path.join(HERE, "results", "peers.png"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global FMS_FSDP_ROOT
    FMS_FSDP_ROOT = args.fms_fsdp

    # 10,000 buffered lines fill at one line a step: 1,250 batches of 8 before timing.
    args.warmup = args.warmup if args.warmup is not None else (200 if args.quick else 1300)
    args.batches = args.batches or (300 if args.quick else 2000)
    args.seconds = args.seconds or (2.0 if args.quick else 6.0)
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0

    import torch

    files, docs = (8, 400) if args.quick else (32, 1000)
    data = os.path.join(args.data, f"{files}x{docs}")
    corpus = prepare(data, files, docs, args.seq)
    args.data = data
    os.sync()
    workers = [int(w) for w in args.workers.split(",") if w]
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "versions": versions(),
        },
        "settings": {
            "seq_length": args.seq,
            "batch_size": BATCH,
            "workers": workers,
            "warmup_batches": args.warmup,
            "timed_batches_max": args.batches,
            "timed_seconds_max": args.seconds,
            "rounds": args.rounds,
        },
        "corpus": corpus,
        "rows": {},
    }
    del torch
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in range(args.rounds):
        bare = run_child("bare", 0, args)
        for name in args.loaders.split(","):
            for w in [0] if name == "bare" else workers:
                print(f"round {r + 1}: {name}, {w} workers ...", flush=True)
                row = bare if name == "bare" else run_child(name, w, args)
                if "error" not in row and "error" not in bare:
                    row["ratio"] = row["tokens_per_s"] / bare["tokens_per_s"]
                runs.setdefault(f"{name}/{w}", []).append(row)
    for key, rows in runs.items():
        good = [r for r in rows if "error" not in r]
        if not good:
            results["rows"][key] = rows[0]
            continue
        merged = dict(good[len(good) // 2])
        for field in ("tokens_per_s", "ratio", "first_batch_s"):
            merged[field] = statistics.median(r[field] for r in good)
        merged["rounds"] = [{f: r.get(f) for f in ("tokens_per_s", "ratio")} for r in good]
        errors = [r["error"] for r in rows if "error" in r]
        if errors:  # a round that failed is said, not dropped
            merged["failed_rounds"] = errors
        results["rows"][key] = merged
    write_results(args.out, results)
    print_table(results)
    chart(results, args.chart)
    return 0


FMS_FSDP_ROOT = FMS_FSDP

if __name__ == "__main__":
    sys.exit(main())
