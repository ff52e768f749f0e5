"""Copy one remote object to a local file: in ranged chunks, resumable, verified, atomic.

The bytes go to a partial file next to the target, named after the object's size and ETag
so a partial of an older version of the object is never continued. Each chunk is one
ranged read, retried on its own; a rerun after a crash continues where the partial ends.
The target name appears only once the size (and the MD5, when the ETag is one) matched,
so a file under its real name is always complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Callable
from typing import Any

import fsspec

from fmsdata.errors import RemoteIOError
from fmsdata.remote.retry import RetryPolicy, retrying

__all__ = [
    "ObjectInfo",
    "fetch",
    "object_info",
    "md5_of_etag",
    "etag_matches",
    "PARTIAL_SUFFIX",
    "partial_target",
]

PARTIAL_SUFFIX = ".fmsdata-partial"
CHUNK_BYTES = 8 << 20
_MD5_ETAG = re.compile(r"^[0-9a-f]{32}$")


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """What a listing says about an object."""

    size: int
    etag: str | None = None


def object_info(entry: dict[str, Any]) -> ObjectInfo:
    """``ObjectInfo`` from an fsspec ``info``/``find(detail=True)`` entry."""
    etag = entry.get("ETag") or entry.get("etag") or entry.get("md5")
    return ObjectInfo(int(entry.get("size") or 0), str(etag).strip('"') if etag else None)


def md5_of_etag(etag: str | None) -> str | None:
    """The object's MD5 when its ETag is one (single-part uploads), else None."""
    return etag if etag and _MD5_ETAG.match(etag) else None


_MULTIPART_ETAG = re.compile(r"^([0-9a-f]{32})-([0-9]+)$")
# Part sizes of common uploaders (aws cli / boto3 8 MiB, s3fs 5 MiB and 50 MiB, ...).
_PART_SIZES_MIB = (8, 5, 16, 32, 50, 64, 100, 128, 256, 512, 1024)


def etag_matches(path: str, etag: str | None, chunk_bytes: int = CHUNK_BYTES) -> bool | None:
    """Whether the local file at ``path`` has the object's ETag: its MD5 for single-part
    uploads; for multipart ones (``md5-of-part-md5s-N``) tried with the part sizes of
    common uploaders that give N parts. None when the ETag allows no check."""
    if not etag:
        return None
    if md5_of_etag(etag):
        return _md5_of_file(path, hashlib.md5(usedforsecurity=False), chunk_bytes) == etag
    match = _MULTIPART_ETAG.match(etag)
    if not match:
        return None
    size, parts = os.path.getsize(path), int(match.group(2))
    candidates = [m << 20 for m in _PART_SIZES_MIB if -(-size // (m << 20)) == parts]
    for part in candidates:
        digests = []
        with open(path, "rb") as handle:
            for _ in range(parts):
                digest, left = hashlib.md5(usedforsecurity=False), part
                while left:
                    block = handle.read(min(chunk_bytes, left))
                    if not block:
                        break
                    digest.update(block)
                    left -= len(block)
                digests.append(digest.digest())
        if hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest() == match.group(1):
            return True
    return None  # an unknown part size: neither confirmed nor refuted


def _md5_of_file(path: str, digest: Any, chunk_bytes: int) -> str:
    """``digest`` updated with the bytes of the file at ``path``; its hex digest."""
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk_bytes), b""):
            digest.update(block)
    return str(digest.hexdigest())


def partial_path(target: str, info: ObjectInfo) -> str:
    tag = hashlib.blake2b(f"{info.size}\0{info.etag}".encode(), digest_size=6).hexdigest()
    return f"{target}.{tag}{PARTIAL_SUFFIX}"


def partial_target(partial: str) -> str:
    """The target a partial file (``partial_path``) is downloaded for."""
    return partial.removesuffix(PARTIAL_SUFFIX).rsplit(".", 1)[0]


def fetch(
    fs: fsspec.AbstractFileSystem,
    path: str,
    url: str,
    target: str,
    info: ObjectInfo,
    policy: RetryPolicy,
    verify_md5: bool = True,
    on_bytes: Callable[[int], None] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    check: Callable[[str], str | None] | None = None,
) -> int:
    """Download ``path`` of ``fs`` (``url`` names it in errors) to ``target``.

    ``check``, when given, looks at the complete partial file before it is renamed and
    returns what is wrong with it (None when it is good).

    Returns:
        Bytes transferred in this call (less than the size when a partial was continued).

    Raises:
        FileNotFoundError: The object does not exist.
        RemoteIOError: A read failed through every retry, or the bytes do not match the
            listed size or MD5 (the partial is removed).
    """
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    partial = partial_path(target, info)
    expected_md5 = md5_of_etag(info.etag) if verify_md5 else None
    digest = hashlib.md5(usedforsecurity=False) if expected_md5 else None
    done = os.path.getsize(partial) if os.path.exists(partial) else 0
    if done > info.size:
        os.remove(partial)
        done = 0
    if digest is not None and done:
        _md5_of_file(partial, digest, chunk_bytes)
    moved = 0
    with open(partial, "ab") as out:
        while done < info.size:
            end = min(done + chunk_bytes, info.size)
            data = retrying(policy, url, fs.cat_file, path, start=done, end=end)
            if len(data) != end - done:
                raise RemoteIOError(
                    f"read {url} bytes {done}-{end} returned {len(data)} bytes "
                    "(object changed or server misbehaves)"
                )
            out.write(data)
            if digest is not None:
                digest.update(data)
            done = end
            moved += len(data)
            if on_bytes is not None:
                on_bytes(len(data))
        out.flush()
        os.fsync(out.fileno())
    size = os.path.getsize(partial)
    if size != info.size:
        problem: str | None = f"got {size} bytes, the listing says {info.size}"
    elif digest is not None and digest.hexdigest() != expected_md5:
        problem = f"MD5 {digest.hexdigest()} does not match ETag {expected_md5}"
    else:
        problem = check(partial) if check is not None else None
    if problem is not None:
        os.remove(partial)
        raise RemoteIOError(f"{url}: {problem}")
    os.replace(partial, target)
    return moved
