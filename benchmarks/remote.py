"""The loader and ``fmsdata download`` over S3, beside the same shards on local disk.

A moto S3 server runs on 127.0.0.1 (as in the tests) holding generated Bamba Arrow shards
and their ``meta/counts.csv``; the same files sit on local disk. Loopback has no network
latency, so every S3 figure is also taken through a proxy that holds each GET back by
``--latency`` seconds (first-byte latency of object storage is tens of milliseconds).
Figures:

- loader, first pass: seconds to the first batch of a fresh loader (empty cache), and
  tokens/s over its first batches, start-up and downloads included;
- loader, steady: tokens/s after a warmup (the files are cached by then);
- download: MB/s of ``fmsdata download`` with 1 and with 8 jobs;
- cache trim: the bookkeeping a download into a cache of 10,000 files costs, a full rescan
  of the folder (what every download paid before the running total) beside the running
  total, under the limit and at it (one eviction per download); no S3 involved;
- start and resume at scale (issue 27): a root of ``--start-files`` Arrow files in two
  datasets, one rank owning ``--start-shards`` logical shards, the cache empty before each
  start: seconds to the first batch and the files and bytes pulled by then, for a fresh
  start, a resume after ``--start-steps`` batches, and a fresh start on the same root
  without ``meta/counts.csv`` (counted from the files' metadata), beside the same root
  read from local disk (loopback S3, no added latency).

- start-up at many ranks (issue 46, ``--ranks-only``; ``benchmarks/remote_ranks.py``):
  ``--ranks`` rank processes started at once over one bucket, each to its first batch,
  fresh and resuming: the requests per rank the server answered (LIST, HEAD, GET, PUT,
  bytes), whether any rank listed the whole root, and, with the ranks of one node sharing
  a cache folder, how often each file was downloaded in all; beyond that, ranks of
  ``--ranks-simulate`` ranks started alone as fresh processes would be.

Loopback moto is a single Python process on the same two cores, so absolute S3 rates say
little; the ratios to local disk and between job counts are what to read.

    python benchmarks/remote.py            # 2 x 16 shards of ~0.5 M tokens
    python benchmarks/remote.py --quick    # 2 x 8 shards
    python benchmarks/remote.py --trim-only  # only the cache trim figures (a few seconds)
    python benchmarks/remote.py --starts-only  # only the start and resume rows
    python benchmarks/remote.py --ranks-only --ranks 8,64  # requests per rank at N ranks

Prints a table and writes ``benchmarks/results/remote.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from benchlib import generated_documents, write_results  # noqa: E402
from formats import write_arrow  # noqa: E402  (the shared format writers live beside the tests)
from s3local import CREDENTIALS, REGION, FaultProxy, S3Server, upload_tree  # noqa: E402

from fmsdata import build_dataloader  # noqa: E402
from fmsdata.cli.bench import tokens_per_second  # noqa: E402
from fmsdata.data.indexing import index_root  # noqa: E402
from fmsdata.handlers import ArrowDocHandler  # noqa: E402
from fmsdata.remote.mirror import plan_mirror, run_mirror  # noqa: E402
from fmsdata.remote.storage import Storage  # noqa: E402
from fmsdata.remote.usage import LOCK_SUFFIX, CacheUsage  # noqa: E402

SEQ = 4096
BATCH = 8
BUCKET = "bench"


def loader_config(root: str, cache: str, endpoint: str | None) -> dict[str, Any]:
    return dict(
        data_path=root,
        datasets=["web", "code"],
        weights=[0.7, 0.3],
        seq_length=SEQ,
        batch_size=BATCH,
        logical_shards=16,
        shuffle_window=16,
        bos_token=0,
        eos_token=1,
        num_workers=1,
        cache_dir=cache,
        endpoint_url=endpoint,
    )


def first_pass(config: dict[str, Any], batches: int) -> tuple[float, float]:
    """Seconds to a fresh loader's first batch, and tokens/s over its first ``batches``
    (start-up and downloads included)."""
    start = time.perf_counter()
    iterator = iter(build_dataloader(config))
    tokens = next(iterator)["input_ids"].numel()
    first = time.perf_counter() - start
    tokens += sum(next(iterator)["input_ids"].numel() for _ in range(batches - 1))
    return first, tokens / (time.perf_counter() - start)


def steady(config: dict[str, Any], warmup: int, batches: int) -> float:
    return tokens_per_second(iter(build_dataloader(config)), warmup, batches)


def download(endpoint: str, dest: str, jobs: int) -> float:
    """Bytes/s of one full ``fmsdata download`` into an empty ``dest``."""
    storage = Storage(endpoint_url=endpoint)
    src = f"s3://{BUCKET}/data"
    plan, manifest = plan_mirror(src, dest, storage)
    result = run_mirror(src, dest, storage, plan, manifest, jobs)
    if result.failed or len(result.transferred) != len(plan.transfers):
        raise RuntimeError(f"download failed: {result.failed}")
    return result.transferred_bytes / result.seconds


def trim_cost(folder: str, files: int = 10_000, downloads: int = 500) -> dict[str, float]:
    """Seconds per download of cache bookkeeping with ``files`` cached (1 KB each, in 10
    folders, each with the lock file its download leaves, where uses are recorded): a full
    rescan, and the running total's ``added`` + ``trim`` under the limit and at it."""

    def write(path: str) -> None:
        with open(path + LOCK_SUFFIX, "a"):
            pass
        with open(path, "wb") as out:
            out.write(b"x" * 1000)

    for i in range(files):
        os.makedirs(os.path.join(folder, f"d{i % 10}"), exist_ok=True)
        write(os.path.join(folder, f"d{i % 10}", f"f{i}.bin"))
    usage = CacheUsage(folder, 1 << 40, rescan_bytes=1 << 40, rescan_seconds=1e9)
    start = time.perf_counter()
    for _ in range(5):
        usage.rescan()
    results = {"full rescan": (time.perf_counter() - start) / 5}
    for case, limit in (("running total, under the limit", 1 << 40), ("at the limit", None)):
        new = [os.path.join(folder, f"d{i % 10}", f"{case[:2]}{i}.bin") for i in range(downloads)]
        usage.rescan()
        usage.limit_bytes = limit if limit is not None else usage.total
        for path in new:
            write(path)
        start = time.perf_counter()
        for path in new:
            usage.added(path)
            usage.trim(keep=path)
        results[case] = (time.perf_counter() - start) / downloads
    return results


def starts_root(server: S3Server, scratch: str, files: int) -> tuple[str, list[str]]:
    """The resume benchmark's root of ``files`` Arrow files on local disk, and in bucket
    ``starts`` with its counts (``counted/``) and without (``bare/``); once per run."""
    from resume import make_root

    local = os.path.join(scratch, f"root{files}")
    client = server.client()
    if os.path.exists(os.path.join(local, "meta", "counts.csv")):
        listed = client.list_objects_v2(Bucket="starts", Prefix="bare/")
        if listed.get("KeyCount"):
            return local, [o["Key"] for o in listed.get("Contents", [])]
    make_root(local, files)
    client.create_bucket(Bucket="starts")
    upload_tree(client, "starts", local, "counted")
    keys = upload_tree(client, "starts", os.path.join(local, "web"), "bare/web")
    keys += upload_tree(client, "starts", os.path.join(local, "code"), "bare/code")
    return local, keys


def folder_bytes(folder: str) -> int:
    """Bytes of the files under ``folder`` (a file renamed or evicted meanwhile skipped)."""
    total = 0
    for d, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                total += os.path.getsize(os.path.join(d, name))
    return total


def held_rows(
    server: S3Server,
    scratch: str,
    files: int,
    shards_list: list[int],
    steps: int,
    cache_gb: float = 100.0,
) -> list[dict[str, Any]]:
    """Measured, per logical shards L and datasets D: the most files one rank (0 workers)
    held open (readers, memory maps, cache pins) and the files it prefetched, over a fresh
    start and ``steps`` batches, then a resume from there and ``steps`` more, over S3
    (loopback), with the file cache trimmed to ``cache_gb`` (``cache_mb``: the most it
    held after a batch); and the most readers open on local disk."""
    from resume import config as resume_config

    from fmsdata.data import filecounts
    from fmsdata.data.access import ReaderCache
    from fmsdata.handlers import mapping
    from fmsdata.remote.cache import RemoteFiles

    local, _ = starts_root(server, scratch, files)
    high = {"readers": 0, "mapped": 0, "pinned": 0, "cache_mb": 0.0}
    prefetched: set[str] = set()
    sources: list[RemoteFiles] = []
    get, init, fetch_ahead = ReaderCache.get, RemoteFiles.__init__, RemoteFiles._prefetch

    def note() -> None:
        high["readers"] = max(high["readers"], max((len(c._open) for c in caches), default=0))
        high["mapped"] = max(high["mapped"], len(mapping.mapped_paths()))
        high["pinned"] = max(high["pinned"], sum(len(s._pins) for s in sources))

    caches: list[Any] = []

    def counted_get(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self not in caches:
            caches.append(self)
        reader = get(self, *args, **kwargs)
        note()
        return reader

    def recorded(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        sources.append(self)

    def counted_prefetch(self: Any, relative: str) -> str:
        prefetched.add(relative)
        return fetch_ahead(self, relative)  # type: ignore[no-any-return]

    ReaderCache.get = counted_get  # type: ignore[method-assign]
    RemoteFiles.__init__ = recorded  # type: ignore[method-assign]
    RemoteFiles._prefetch = counted_prefetch  # type: ignore[method-assign]

    def run(root: str, shards: int, datasets: list[str], cache: str, state: Any = None) -> Any:
        filecounts.forget_all()
        high.update(readers=0, mapped=0, pinned=0, cache_mb=0.0)
        prefetched.clear()
        caches.clear()
        sources.clear()
        config = {
            **resume_config(root, shards),
            "datasets": datasets,
            "weights": [0.7, 0.3][: len(datasets)],
            "cache_dir": cache,
            "remote_cache_gb": cache_gb,
        }
        if root.startswith("s3://"):
            config["endpoint_url"] = server.url
        loader = build_dataloader(config)
        if state is not None:
            loader.load_state_dict(state)
        batches = iter(loader)
        for _ in range(steps):
            next(batches)
            note()
            high["cache_mb"] = max(high["cache_mb"], folder_bytes(cache) / 1e6)
        return loader.state_dict()

    rows = []
    try:
        for shards in shards_list:
            for datasets in (["web"], ["web", "code"]):
                row: dict[str, Any] = {"shards": shards, "datasets": len(datasets)}
                tag = f"{shards}-{len(datasets)}"
                for label, root in (("s3", "s3://starts/counted"), ("local", local)):
                    cache = os.path.join(scratch, f"held-{label}-{tag}")
                    state = run(root, shards, datasets, cache + "-a")
                    row[f"{label}_start"] = {**high, "prefetched": len(prefetched)}
                    run(root, shards, datasets, cache + "-b", state)
                    row[f"{label}_resume"] = {**high, "prefetched": len(prefetched)}
                rows.append(row)
                s3s, s3r, loc = row["s3_start"], row["s3_resume"], row["local_resume"]
                print(
                    f"L={shards:<5} D={len(datasets)}  s3 start: {s3s['readers']:5} open "
                    f"{s3s['pinned']:5} pinned {s3s['prefetched']:5} prefetched | s3 resume: "
                    f"{s3r['readers']:5} open {s3r['pinned']:5} pinned "
                    f"{s3r['prefetched']:5} prefetched {s3r['cache_mb']:7.1f} MB cached | "
                    f"local resume: {loc['readers']:5} open",
                    flush=True,
                )
    finally:
        ReaderCache.get = get  # type: ignore[method-assign]
        RemoteFiles.__init__ = init  # type: ignore[method-assign]
        RemoteFiles._prefetch = fetch_ahead  # type: ignore[method-assign]
        filecounts.forget_all()
    return rows


def start_rows(server: S3Server, scratch: str, files: int, shards: int, steps: int) -> list:
    """Fresh start, resume and fresh start without counts over S3 (loopback), and fresh
    start and resume from local disk: seconds to the first batch, files and bytes pulled."""
    from resume import config as resume_config  # the resume benchmark's loader

    from fmsdata.data import filecounts
    from fmsdata.remote.cache import RemoteFiles

    local, keys = starts_root(server, scratch, files)
    pulled: list[int] = []
    download = RemoteFiles._download

    def counted(self: Any, relative: str, target: str) -> None:
        download(self, relative, target)
        pulled.append(os.path.getsize(target))

    RemoteFiles._download = counted  # type: ignore[method-assign]

    def start(label: str, root: str, state: Any = None, counts: str = "") -> dict[str, Any]:
        """One start with an empty file cache (``counts``: a counts cache to start with)."""
        filecounts.forget_all()  # as in a fresh process
        pulled.clear()
        cache = os.path.join(scratch, "cache-" + label.replace(" ", "-").replace(",", ""))
        if counts:
            shutil.copytree(os.path.join(counts, "counts"), os.path.join(cache, "counts"))
        config = {**resume_config(root, shards), "cache_dir": cache}
        if root.startswith("s3://"):
            config["endpoint_url"] = server.url
        begin = time.perf_counter()
        loader = build_dataloader(config)
        if state is not None:
            loader.load_state_dict(state)
        next(iter(loader))
        row = {
            "case": label,
            "first_batch_s": time.perf_counter() - begin,
            "files_pulled": len(pulled),
            "bytes_pulled": sum(pulled),
        }
        print(
            f"{label:44} {row['first_batch_s']:8.2f} s {row['files_pulled']:7} files "
            f"{row['bytes_pulled'] / 1e6:9.1f} MB",
            flush=True,
        )
        return row

    def saved(root: str) -> Any:
        config = {**resume_config(root, shards), "cache_dir": os.path.join(scratch, "c-save")}
        if root.startswith("s3://"):
            config["endpoint_url"] = server.url
        loader = build_dataloader(config)
        batches = iter(loader)
        for _ in range(steps):
            next(batches)
        return loader.state_dict()

    print(f"\n{files:,} files, {shards} logical shards, resume after {steps} batches")
    try:
        s3_state, local_state = saved("s3://starts/counted"), saved(local)
        rows = [
            start("s3, fresh start", "s3://starts/counted"),
            start("s3, resume", "s3://starts/counted", s3_state),
            start("s3, fresh start without counts.csv", "s3://starts/bare"),
            start(
                "s3, same, counts cached by a first process",
                "s3://starts/bare",
                counts=os.path.join(scratch, "cache-s3-fresh-start-without-counts.csv"),
            ),
            start("local disk, fresh start", local),
            start("local disk, resume", local, local_state),
        ]
    finally:
        RemoteFiles._download = download  # type: ignore[method-assign]
        filecounts.forget_all()
    for row in rows:
        row.update(files=files, shards=shards, steps=steps, root_files=len(keys))
    return rows


def print_trim(trim: dict[str, float], files: int) -> None:
    print(
        f"\n{'cache trim, ' + str(files) + ' files cached':32} {'per download':>12} {'ratio':>10}"
    )
    base = trim["full rescan"]
    for name, seconds in trim.items():
        print(f"{name:32} {seconds * 1e6:10.0f} us {base / seconds:10.0f}x")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer shards and batches")
    parser.add_argument("--latency", type=float, default=0.03, help="seconds added per GET")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "remote.json"))
    parser.add_argument("--trim-only", action="store_true", help="only the cache trim figures")
    parser.add_argument("--starts-only", action="store_true", help="only the start rows")
    parser.add_argument("--start-files", type=int, default=2000, help="files of the start rows")
    parser.add_argument("--start-shards", type=int, default=256, help="their logical shards")
    parser.add_argument("--start-steps", type=int, default=100, help="batches before the save")
    parser.add_argument(
        "--held-shards", default="16,64,256", help="logical shards of the files-held rows"
    )
    parser.add_argument("--held-only", action="store_true", help="only the files-held rows")
    parser.add_argument("--held-cache-gb", type=float, default=100.0, help="their remote_cache_gb")
    parser.add_argument("--ranks-only", action="store_true", help="only the rank start-up rows")
    parser.add_argument("--ranks", default="8,64", help="rank processes started at once")
    parser.add_argument(
        "--ranks-simulate", default="256,1024", help="job sizes of the simulated rank starts"
    )
    parser.add_argument("--ranks-files", type=int, default=256, help="files of the rank rows")
    parser.add_argument(
        "--ranks-shards", type=int, default=1024, help="their logical shards (all sizes divide)"
    )
    args = parser.parse_args()
    if args.ranks_only:
        from remote_ranks import rank_rows

        from fmsdata.util import compiled

        for key, value in CREDENTIALS.items():
            os.environ[key.upper()] = value
        os.environ["AWS_DEFAULT_REGION"] = REGION
        scratch = tempfile.mkdtemp(prefix="fmsdata-remote-")
        server = S3Server()
        worlds = [int(v) for v in args.ranks.split(",")]
        sims = [int(v) for v in args.ranks_simulate.split(",") if v]
        try:
            with compiled.serving("foreground"):  # compiled here, before the ranks fork
                ranks = rank_rows(
                    server, scratch, args.ranks_files, args.ranks_shards, worlds, sims
                )
        finally:
            server.stop()
            shutil.rmtree(scratch, ignore_errors=True)
        write_results(args.out, {"ranks": ranks})
        return 0
    if args.held_only:
        for key, value in CREDENTIALS.items():
            os.environ[key.upper()] = value
        os.environ["AWS_DEFAULT_REGION"] = REGION
        scratch = tempfile.mkdtemp(prefix="fmsdata-remote-")
        server = S3Server()
        try:
            shards = [int(v) for v in args.held_shards.split(",")]
            held = held_rows(server, scratch, args.start_files, shards, 50, args.held_cache_gb)
        finally:
            server.stop()
            shutil.rmtree(scratch, ignore_errors=True)
        write_results(args.out, {"held": held, "remote_cache_gb": args.held_cache_gb})
        return 0
    if args.starts_only:
        for key, value in CREDENTIALS.items():
            os.environ[key.upper()] = value
        os.environ["AWS_DEFAULT_REGION"] = REGION
        scratch = tempfile.mkdtemp(prefix="fmsdata-remote-")
        server = S3Server()
        try:
            rows = start_rows(
                server, scratch, args.start_files, args.start_shards, args.start_steps
            )
        finally:
            server.stop()
            shutil.rmtree(scratch, ignore_errors=True)
        write_results(args.out, {"starts": rows})
        return 0
    trim_files = 10_000
    with tempfile.TemporaryDirectory(prefix="fmsdata-trim-") as folder:
        trim = trim_cost(folder, trim_files)
    print_trim(trim, trim_files)
    if args.trim_only:
        return 0
    files, docs = (8, 700) if args.quick else (16, 700)
    first, warmup, batches = (100, 100, 1000) if args.quick else (300, 200, 3000)

    for key, value in CREDENTIALS.items():
        os.environ[key.upper()] = value
    os.environ["AWS_DEFAULT_REGION"] = REGION
    scratch = tempfile.mkdtemp(prefix="fmsdata-remote-")
    server = S3Server()
    proxy = FaultProxy(server.url, delay=args.latency)
    results: dict[str, Any] = {"seq_length": SEQ, "batch_size": BATCH, "num_workers": 1}
    results["latency_s"] = args.latency
    try:
        local = os.path.join(scratch, "local")
        write_arrow(local, generated_documents(files, docs))
        index_root(local, ArrowDocHandler())  # meta/counts.csv, as the Bamba release has
        client = server.client()
        client.create_bucket(Bucket=BUCKET)
        keys = upload_tree(client, BUCKET, local, "data")
        results["files"] = len(keys)
        results["bytes"] = sum(
            os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(local) for f in fs
        )
        s3_root = f"s3://{BUCKET}/data"
        sources = {
            "local disk": (local, None),
            "s3 loopback": (s3_root, server.url),
            f"s3 + {args.latency * 1000:.0f} ms/GET": (s3_root, proxy.url),
        }
        for name, (root, endpoint) in sources.items():
            cache = os.path.join(scratch, "cache-" + name.split()[0] + str(len(results)))
            config = loader_config(root, cache, endpoint)
            latency, results[f"{name}, first pass"] = first_pass(config, first)
            results[f"{name}, first batch s"] = latency
            results[f"{name}, steady"] = steady(config, warmup, batches)
            print(
                f"{name:24} first {results[f'{name}, first pass'] / 1e6:7.1f} M tok/s, "
                f"steady {results[f'{name}, steady'] / 1e6:7.1f} M tok/s",
                flush=True,
            )
        for label, endpoint in (("loopback", server.url), ("latency", proxy.url)):
            for jobs in (1, 8):
                dest = os.path.join(scratch, f"download-{label}-{jobs}")
                results[f"download {label}, {jobs} job(s)"] = download(endpoint, dest, jobs)
                shutil.rmtree(dest)
        results["starts"] = start_rows(
            server, scratch, args.start_files, args.start_shards, args.start_steps
        )
    finally:
        proxy.stop()
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    print(f"\n{results['files']} shards, {results['bytes'] / 1e6:.1f} MB\n")
    print(f"{'loader (1 worker)':32} {'tokens/s':>12} {'vs local':>10}")
    for kind in ("first pass", "steady"):
        base = results[f"local disk, {kind}"]
        for name in sources:
            value = results[f"{name}, {kind}"]
            print(f"{name + ', ' + kind:32} {value / 1e6:10.1f} M {value / base:10.2f}")
    for name in sources:
        print(f"{'first batch, ' + name:32} {results[f'{name}, first batch s']:10.2f} s")
    print(f"\n{'fmsdata download':32} {'MB/s':>12} {'vs 1 job':>10}")
    for label in ("loopback", "latency"):
        base = results[f"download {label}, 1 job(s)"]
        for jobs in (1, 8):
            value = results[f"download {label}, {jobs} job(s)"]
            print(f"{label + f', {jobs} job(s)':32} {value / 1e6:12.1f} {value / base:10.2f}")
    print_trim(trim, trim_files)
    results.update({f"trim {name}, s per download": value for name, value in trim.items()})
    results["trim files cached"] = trim_files
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
