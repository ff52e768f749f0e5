"""Start-up of N ranks at once over one bucket (issue 46): the requests each rank sends
from nothing to its first batch, fresh and resuming; ``benchmarks/remote.py --ranks``.

N rank processes (0 workers each, forked from this one once it has compiled the kernels,
so that what is timed is the start, not numba) wait at a barrier and start together over
one root in a moto S3 server on loopback, through a proxy that records every request
with the rank that sent it (``tests/s3local.py``; the rank rides in the User-Agent). Each
rank builds its loader and takes one batch; the request counts are the server's, per
rank. Three runs per N:

- fresh, each rank on a node of its own (an empty cache of its own), and each saves its
  state into one checkpoint folder in the bucket afterwards (not counted);
- resume from that folder, each rank on a node of its own again;
- fresh, all N ranks on one node (one cache folder): how often each object was
  downloaded in all (1.0: once between them).

Beyond what the machine can start at once, ``simulated`` starts ranks 0 and W - 1 of a
job of W ranks one after another in this process, as fresh processes would start (no
cached filesystem, listing or counts): the counts of one rank depend on its rank and W,
not on the other ranks running.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import shutil
import statistics
import time
from typing import Any

from rankstarts import KINDS, forget_process_caches, per_rank, rank_config, whole_listings
from s3local import FaultProxy, S3Server, upload_tree

from fmsdata import build_dataloader
from fmsdata.checkpoint import load_loader_state, save_loader_state
from fmsdata.remote import requests
from fmsdata.remote.retry import RetryPolicy
from fmsdata.remote.storage import Storage

BUCKET = "ranks"
PREFIX = "root"


def make_root(server: S3Server, scratch: str, files: int) -> str:
    """The resume benchmark's root of ``files`` Arrow files (with ``meta/counts.csv``), on
    local disk and in the bucket; returns the local path."""
    from resume import make_root as write_root

    local = os.path.join(scratch, f"ranks-root{files}")
    write_root(local, files)
    client = server.client()
    client.create_bucket(Bucket=BUCKET)
    upload_tree(client, BUCKET, local, PREFIX)
    return local


def _rank(
    config: dict[str, Any],
    rank: int,
    world: int,
    resume_from: str | None,
    save_to: str | None,
    barrier: Any,
    results: Any,
) -> None:
    """One rank process: wait for the others, start, take a batch, report, save."""
    forget_process_caches()
    barrier.wait()
    begin = time.perf_counter()
    before = requests.counts()
    loader = build_dataloader(config, rank=rank, world_size=world)
    if resume_from is not None:
        load_loader_state(loader, resume_from)
    next(iter(loader))
    seconds = time.perf_counter() - begin
    calls = requests.as_dict(requests.counts() - before)
    results.put({"rank": rank, "first_batch_s": seconds, "calls": calls})
    if save_to is not None:  # its requests go untagged: not counted as the rank's start
        untagged = Storage(endpoint_url=config["endpoint_url"], retry=RetryPolicy(backoff=0.05))
        save_loader_state(loader, save_to, storage=untagged)
    loader.close()


def run_ranks(
    config: dict[str, Any],
    proxy: FaultProxy,
    world: int,
    caches: str,
    shared_cache: bool,
    resume_from: str | None = None,
    save_to: str | None = None,
) -> dict[str, Any]:
    """Start ``world`` rank processes at once; their requests as the server saw them."""
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(world), context.Queue()
    mark = len(proxy.log)
    processes = []
    for rank in range(world):
        cache = os.path.join(caches, "node" if shared_cache else f"rank{rank}")
        process = context.Process(
            target=_rank,
            args=(
                rank_config(config, rank, cache),
                rank,
                world,
                resume_from,
                save_to,
                barrier,
                results,
            ),  # fmt: skip
        )
        process.start()
        processes.append(process)
    reported = [results.get(timeout=900) for _ in range(world)]
    for process in processes:
        process.join(timeout=300)
        if process.exitcode != 0:
            raise RuntimeError(f"a rank process ended with {process.exitcode}")
    log = proxy.log[mark:]
    return {"log": log, "reported": sorted(reported, key=lambda r: r["rank"])}


def summary(log: list[Any], reported: list[dict[str, Any]], world: int) -> dict[str, Any]:
    """Per-rank figures: the median and the most of each kind of request, bytes read,
    fmsdata's own count of its calls, seconds to the first batch."""
    counts = per_rank(log, range(world))
    row: dict[str, Any] = {}
    for kind in (*KINDS, "bytes"):
        values = [counts[rank][kind] for rank in range(world)]
        row[kind] = {"median": statistics.median(values), "max": max(values)}
    calls = [r["calls"] for r in reported]
    row["calls"] = {k: statistics.median(c[k] for c in calls) for k in ("LIST", "HEAD", "GET")}
    seconds = [r["first_batch_s"] for r in reported]
    row["first_batch_s"] = {"median": statistics.median(seconds), "max": max(seconds)}
    row["whole_root_listings"] = whole_listings(log, PREFIX)
    return row


def downloads_per_object(log: list[Any]) -> dict[str, Any]:
    """How often each data object was read in all (shared cache): GETs of shard files
    over the distinct shard files read, and bytes over their distinct bytes."""
    reads = [r for r in log if r.kind == "GET" and "/meta/" not in r.key]
    reads = [r for r in reads if not r.key.endswith((".json", ".csv"))]
    by_key: collections.Counter[str] = collections.Counter(r.key for r in reads)
    size: dict[str, int] = collections.defaultdict(int)
    for r in reads:
        size[r.key] += r.bytes
    distinct = {key: size[key] / by_key[key] for key in by_key}
    return {
        "objects": len(by_key),
        "gets": sum(by_key.values()),
        "bytes": sum(r.bytes for r in reads),
        "distinct_bytes": int(sum(distinct.values())),
        "most_reads_of_one_object": max(by_key.values(), default=0),
    }


def simulated(
    config: dict[str, Any], proxy: FaultProxy, world: int, caches: str, resume_from: str
) -> dict[str, Any]:
    """Ranks 0 and ``world - 1`` of a job of ``world`` ranks, fresh and resuming from
    ``resume_from`` (a save of another world size: each reads the rank files that hold
    its shards), one after another in this process, each on a node of its own."""
    rows: dict[str, Any] = {}
    for label, folder in (("fresh", None), ("resume", resume_from)):
        counts = {}
        for rank in (0, world - 1):
            mark = len(proxy.log)
            cache = os.path.join(caches, f"sim-{world}-{rank}-{label}")
            rank_config_ = rank_config(config, rank, cache)
            forget_process_caches()
            loader = build_dataloader(rank_config_, rank=rank, world_size=world)
            if folder is not None:
                load_loader_state(loader, folder)
            next(iter(loader))
            loader.close()
            counts[rank] = per_rank(proxy.log[mark:], [rank])[rank]
        rows[label] = {
            kind: max(counts[rank][kind] for rank in counts) for kind in (*KINDS, "bytes")
        }
    return rows


def rank_rows(
    server: S3Server, scratch: str, files: int, shards: int, worlds: list[int], sims: list[int]
) -> dict[str, Any]:
    """Every figure of the module docstring, printed as a table per N; returned for JSON."""
    from resume import config as resume_config

    local = make_root(server, scratch, files)
    proxy = FaultProxy(server.url)
    config = {
        **resume_config(f"s3://{BUCKET}/{PREFIX}", shards),
        "endpoint_url": proxy.url,
        "remote_backoff": 0.05,
    }
    # The kernels compiled here, once: the rank processes are forked with them.
    warm = build_dataloader({**resume_config(local, shards), "cache_dir": scratch}, world_size=1)
    next(iter(warm))
    warm.close()
    results: dict[str, Any] = {"files": files, "logical_shards": shards, "worlds": {}}
    try:
        for world in worlds:
            caches = os.path.join(scratch, f"caches-{world}")
            folder = f"s3://{BUCKET}/ckpt-{world}"
            fresh = run_ranks(config, proxy, world, caches + "-fresh", False, save_to=folder)
            resumed = run_ranks(config, proxy, world, caches + "-resume", False, folder)
            node = run_ranks(config, proxy, world, caches + "-node", True)
            row = {
                "fresh": summary(fresh["log"], fresh["reported"], world),
                "resume": summary(resumed["log"], resumed["reported"], world),
                "one node": downloads_per_object(node["log"]),
            }
            results["worlds"][str(world)] = row
            print_world(world, row)
            shutil.rmtree(caches + "-fresh", ignore_errors=True)
            shutil.rmtree(caches + "-resume", ignore_errors=True)
            shutil.rmtree(caches + "-node", ignore_errors=True)
        results["simulated"] = {}
        for world in sims:
            sim = simulated(config, proxy, world, scratch, f"s3://{BUCKET}/ckpt-{worlds[0]}")
            results["simulated"][str(world)] = sim
        print_simulated(results["simulated"], worlds[0])
    finally:
        proxy.stop()
    return results


def print_world(world: int, row: dict[str, Any]) -> None:
    print(f"\n{world} ranks started at once: requests per rank (server's count), median / most")
    print(f"{'':8}" + "".join(f"{k:>14}" for k in (*KINDS, "MB read", "first batch s")))
    for label in ("fresh", "resume"):
        r = row[label]
        cells = [f"{r[k]['median']:>7g} /{r[k]['max']:>5g}" for k in KINDS]
        cells.append(f"{r['bytes']['median'] / 1e6:>6.2f} /{r['bytes']['max'] / 1e6:>6.2f}")
        s = r["first_batch_s"]
        cells.append(f"{s['median']:>6.1f} /{s['max']:>6.1f}")
        print(f"{label:8}" + "".join(f"{c:>14}" for c in cells))
        if r["whole_root_listings"]:
            print(f"{'':8}listed whole: {r['whole_root_listings']}")
    node = row["one node"]
    print(
        f"one node (shared cache): {node['gets']} GETs of {node['objects']} shard files, "
        f"{node['bytes'] / 1e6:.1f} MB for {node['distinct_bytes'] / 1e6:.1f} MB of distinct "
        f"files; the most reads of one file: {node['most_reads_of_one_object']}"
    )


def print_simulated(sims: dict[str, Any], saved: int) -> None:
    print(
        f"\nsimulated (ranks 0 and W-1 started alone, as fresh processes; the resume reads "
        f"the save of {saved} ranks): requests of the rank that sent more"
    )
    print(f"{'W':>6} {'':7}" + "".join(f"{k:>8}" for k in KINDS) + f"{'MB read':>10}")
    for world, rows in sims.items():
        for label, r in rows.items():
            cells = "".join(f"{r[k]:>8}" for k in KINDS)
            print(f"{world:>6} {label:7}{cells}{r['bytes'] / 1e6:>10.2f}")
