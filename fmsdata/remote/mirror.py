"""Copy a remote tree of shards to a local folder: ``fmsdata download``'s engine.

A rerun transfers only what is missing: a local file counts as complete when its size
matches and its ETag is confirmed (recorded from an earlier verified transfer in
``DEST/.fmsdata-download.json``, or recomputed from the file when the ETag is an MD5);
an interrupted transfer continues from its partial file. Keys are checked before
anything is written: one that would land outside DEST (``..``, an absolute path, a drive
letter) is refused and reported, never written.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fnmatch
import glob
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from fmsdata.remote.retry import retrying
from fmsdata.remote.storage import Storage
from fmsdata.remote.transfer import (
    PARTIAL_SUFFIX,
    ObjectInfo,
    etag_matches,
    fetch,
    md5_of_etag,
    object_info,
)
from fmsdata.util.urls import local_path, location

__all__ = ["MirrorPlan", "MirrorResult", "plan_mirror", "run_mirror", "refusal", "MANIFEST"]

logger = logging.getLogger(__name__)

MANIFEST = ".fmsdata-download.json"
_DRIVE = re.compile(r"^[A-Za-z]:")


def refusal(key: str) -> str | None:
    """Why a key relative to the source must not become a local path (None if it may)."""
    if not key:
        return "empty key"
    if "\x00" in key:
        return "NUL byte in key"
    if key.startswith(("/", "\\")):
        return "absolute path"
    if _DRIVE.match(key):
        return "drive letter"
    if any(part == ".." for part in re.split(r"[\\/]", key)):
        return "parent reference '..'"
    return None


@dataclasses.dataclass(frozen=True)
class Transfer:
    key: str  # relative to the source, "/"-separated
    path: str  # inside the filesystem
    info: ObjectInfo


@dataclasses.dataclass
class MirrorPlan:
    """What a download would do."""

    transfers: list[Transfer]
    complete: list[str]
    refused: list[tuple[str, str]]
    excluded: int

    @property
    def transfer_bytes(self) -> int:
        return sum(t.info.size for t in self.transfers)


@dataclasses.dataclass
class MirrorResult:
    transferred: list[str] = dataclasses.field(default_factory=list)
    transferred_bytes: int = 0
    failed: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0


def _load_manifest(dest: str) -> dict[str, dict[str, Any]]:
    path = os.path.join(dest, MANIFEST)
    try:
        with open(path) as handle:
            data = json.load(handle)
        files = data["files"]
        if not isinstance(files, dict):
            raise TypeError("files is not a mapping")
        return {str(k): v for k, v in files.items() if isinstance(v, dict)}
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError) as err:
        logger.warning("%s is unreadable (%s): complete files are verified again", path, err)
        return {}


def _save_manifest(dest: str, files: dict[str, dict[str, Any]]) -> None:
    path = os.path.join(dest, MANIFEST)
    partial = f"{path}.tmp{os.getpid()}"
    with open(partial, "w") as out:
        json.dump({"version": 1, "files": files}, out, sort_keys=True)
    os.replace(partial, path)


def _matches(key: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, p) for p in patterns)


def _local(dest: str, key: str) -> str:
    return os.path.join(dest, *key.split("/"))


def _record(local: str, info: ObjectInfo) -> dict[str, Any]:
    """What the manifest keeps of a verified file: the object's size and ETag, and the
    local file's modification time (a later local change invalidates the record)."""
    return {"size": info.size, "etag": info.etag, "mtime_ns": os.stat(local).st_mtime_ns}


def _is_complete(local: str, key: str, info: ObjectInfo, manifest: dict[str, Any]) -> bool:
    try:
        stat = os.stat(local)
    except OSError:
        return False
    if stat.st_size != info.size:
        return False
    if manifest.get(key) == {"size": info.size, "etag": info.etag, "mtime_ns": stat.st_mtime_ns}:
        return True
    if info.etag is None:
        return True  # the backend gives no ETag: the size is all there is to compare
    if etag_matches(local, info.etag):
        manifest[key] = _record(local, info)
        return True
    return False


def plan_mirror(
    src: str,
    dest: str,
    storage: Storage,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> tuple[MirrorPlan, dict[str, dict[str, Any]]]:
    """List ``src`` and decide what to transfer; returns the plan and the manifest.

    Raises:
        ConfigError: ``src`` is a URL of an unknown protocol, or ``dest`` is a URL.
    """
    src = location(src, "download source")
    dest = local_path(dest, "download destination", "download copies to this machine")
    fs, base = storage.filesystem(src)
    policy = storage.retry
    entry = retrying(policy, src, fs.info, base, what="stat")
    if entry.get("type") == "file":
        listing = {base: entry}
        prefix = base.rsplit("/", 1)[0] if "/" in base else ""
    else:
        listing = retrying(policy, src, fs.find, base, detail=True, what="list")
        prefix = base
    manifest = _load_manifest(dest)
    transfers, complete, refused, excluded = [], [], [], 0
    root = os.path.realpath(dest)
    for path, info_entry in sorted(listing.items()):
        if info_entry.get("type") != "file":
            continue
        # Exactly one separator after the prefix: "prefix//x" is the key "/x" (absolute).
        key = path[len(prefix) + 1 :] if prefix else path
        if (include and not _matches(key, include)) or _matches(key, exclude):
            excluded += 1
            continue
        reason = refusal(key)
        if reason is None:
            local = os.path.realpath(_local(dest, key))
            if not local.startswith(root + os.sep):
                reason = "resolves outside the destination"
        if reason is not None:
            refused.append((key, reason))
            continue
        info = object_info(info_entry)
        if _is_complete(_local(dest, key), key, info, manifest):
            complete.append(key)
        else:
            transfers.append(Transfer(key, path, info))
    return MirrorPlan(transfers, complete, refused, excluded), manifest


def run_mirror(
    src: str,
    dest: str,
    storage: Storage,
    plan: MirrorPlan,
    manifest: dict[str, dict[str, Any]],
    jobs: int = 8,
    on_bytes: Callable[[int], None] | None = None,
    on_file: Callable[[str, str | None], None] | None = None,
) -> MirrorResult:
    """Transfer the plan's files with ``jobs`` in parallel; a failure does not stop others.

    ``on_bytes(n)`` is called as bytes arrive (from worker threads); ``on_file(key, error)``
    when a file is done (error None) or failed.
    """
    fs, _ = storage.filesystem(location(src, "download source"))
    dest = local_path(dest, "download destination", "download copies to this machine")
    os.makedirs(dest, exist_ok=True)
    result = MirrorResult()
    lock = threading.Lock()
    start = time.perf_counter()

    def moved(n: int) -> None:
        with lock:
            result.transferred_bytes += n
        if on_bytes is not None:
            on_bytes(n)

    def one(transfer: Transfer) -> None:
        target = _local(dest, transfer.key)
        url = f"{src.rstrip('/')}/{transfer.key}" if transfer.key else src
        info = transfer.info
        etag = info.etag

        def check(partial: str) -> str | None:
            if md5_of_etag(etag):
                return None  # fetch checked the MD5 while the bytes arrived
            matches = etag_matches(partial, etag)
            return f"content does not match ETag {etag}" if matches is False else None

        fetch(fs, transfer.path, url, target, info, storage.retry, on_bytes=moved, check=check)
        for stale in glob.glob(glob.escape(target) + ".*" + PARTIAL_SUFFIX):
            os.remove(stale)  # partials of older versions of the object

    last_save = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        futures = {pool.submit(one, t): t for t in plan.transfers}
        for future in concurrent.futures.as_completed(futures):
            transfer = futures[future]
            error = future.exception()
            if error is None:
                result.transferred.append(transfer.key)
                manifest[transfer.key] = _record(_local(dest, transfer.key), transfer.info)
            else:
                result.failed.append((transfer.key, f"{type(error).__name__}: {error}"))
            if on_file is not None:
                on_file(transfer.key, None if error is None else str(error))
            if time.monotonic() - last_save > 5:
                _save_manifest(dest, manifest)
                last_save = time.monotonic()
    _save_manifest(dest, manifest)
    result.seconds = time.perf_counter() - start
    return result
