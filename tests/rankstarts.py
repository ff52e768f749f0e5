"""One rank's start over S3, counted: what a rank of a job of N ranks asks of the store
from nothing to its first batch, fresh or resuming (issue 46).

A rank here is a loader with 0 workers over an ``s3://`` root reached through a
``FaultProxy`` that records every request and tags it with the rank (the client's
User-Agent carries ``fmsdata-rank/R``). ``start_rank`` runs one as a fresh process would
(no filesystem object, counts or listing cached in this process); ``benchmarks/remote.py``
runs N of them at once in N processes, the tests one after another.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from s3local import Request

from fmsdata import build_dataloader
from fmsdata.checkpoint import load_loader_state
from fmsdata.data import filecounts
from fmsdata.remote import requests, storage

KINDS = ("LIST", "HEAD", "GET", "PUT")


def rank_config(config: dict[str, Any], rank: int, cache_dir: str) -> dict[str, Any]:
    """``config`` for rank ``rank``: its requests tagged, its cache folder."""
    options = dict(config.get("storage_options") or {})
    options["config_kwargs"] = {"user_agent_extra": f"fmsdata-rank/{rank}"}
    return {**config, "storage_options": options, "cache_dir": cache_dir}


def forget_process_caches() -> None:
    """What a fresh process would not have: filesystem objects (their listing caches)
    and the file counts read so far."""
    storage._filesystems.clear()
    filecounts.forget_all()


def start_rank(
    config: dict[str, Any], rank: int, world: int, resume_from: str | None = None
) -> dict[str, Any]:
    """Build rank ``rank`` of ``world`` (``config`` from ``rank_config``), load the
    checkpoint folder ``resume_from`` if given, take the first batch. Returns the calls
    fmsdata counted (``fmsdata.remote.requests``) and the batch's first tokens."""
    forget_process_caches()
    before = requests.counts()
    loader = build_dataloader(config, rank=rank, world_size=world)
    if resume_from is not None:
        load_loader_state(loader, resume_from)
    batch = next(iter(loader))
    calls = requests.as_dict(requests.counts() - before)
    loader.close()
    return {"rank": rank, "calls": calls, "first": batch["input_ids"][:, :4].tolist()}


def per_rank(log: Sequence[Request], ranks: Sequence[int]) -> dict[int, dict[str, int]]:
    """The requests of each rank in ``log`` by kind, and the bytes of the objects it read."""
    found: dict[int, collections.Counter[str]] = {rank: collections.Counter() for rank in ranks}
    for request in log:
        if request.rank in found:
            found[request.rank][request.kind] += 1
            if request.kind == "GET":  # object bodies (a listing's XML is not counted)
                found[request.rank]["bytes"] += request.bytes
    return {rank: {kind: found[rank][kind] for kind in (*KINDS, "bytes")} for rank in ranks}


def whole_listings(log: Sequence[Request], root_prefix: str) -> list[str]:
    """The listings of every key under the root or above it (the whole bucket, or the
    root's prefix without a delimiter): what no rank needs once ``meta/counts.csv``
    exists. A listing of one level (with a delimiter) or of one dataset is not one."""
    root = root_prefix.strip("/") + "/"
    return sorted(
        {
            r.prefix or "(the whole bucket)"
            for r in log
            if r.kind == "LIST" and r.recursive and root.startswith(r.prefix or "")
        }
    )
