"""A folder of small files on local disk or on any fsspec filesystem: list, read, write
whole, delete, remove.

Loader checkpoints live in such folders (``fmsdata.checkpoint``); this module is the only
one that knows how each kind of storage makes a write all-or-nothing:

- Local paths (and ``file://`` URLs): a temporary file beside the target, fsynced, then
  ``os.replace``. A folder is removed by renaming it out of view first.
- Object stores (``s3://``, ``gs://``, ``az://``, ``memory://``, ...): one PUT per file,
  which the store applies whole or not at all (a multipart upload too: the object appears
  when the upload completes). There is no rename; a folder is a key prefix, removed
  object by object.
- Other fsspec filesystems (``sftp://``, ``hdfs://``, ...): a temporary name, then
  ``fs.mv``.

Remote calls go through ``fmsdata.remote.retry.retrying`` with the ``Storage``'s policy,
options and credentials, the same as data roots. Listings always ask the store (fsspec's
listing cache is dropped first): another rank may have written a file a moment ago.
"""

from __future__ import annotations

import contextlib
import functools
import os
import posixpath
import shutil
from typing import Any

from fmsdata.errors import RemoteIOError
from fmsdata.remote.retry import retrying
from fmsdata.remote.storage import Storage, is_local
from fmsdata.util.urls import url_scheme

__all__ = ["Folder", "ATOMIC_PUT_PROTOCOLS"]

# Protocols whose stores apply a PUT whole or not at all: a file is written in place.
ATOMIC_PUT_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "oss", "memory"})
_TMP_SUFFIX = ".tmp"


class Folder:
    """A folder at ``location`` (a local path or an fsspec URL).

    Args:
        location: Where the folder is; it need not exist yet (writes create it).
        storage: Access options, credentials and retries for URLs (default: the AWS
            environment, 8 tries).
    """

    def __init__(self, location: str | os.PathLike[str], storage: Storage | None = None):
        self.location = os.fspath(location)
        self.storage = storage if storage is not None else Storage()
        scheme = url_scheme(self.location)
        self.protocol = scheme.lower() if scheme is not None else None

    def __repr__(self) -> str:
        return f"Folder({self.location!r})"

    # -- names ---------------------------------------------------------------------

    def join(self, name: str) -> str:
        """The location of ``name`` inside this folder, in the form the user gave."""
        if self.protocol is None:
            return os.path.join(self.location, name)
        return f"{self.location.rstrip('/')}/{name}"

    def sub(self, name: str) -> Folder:
        """The folder ``name`` inside this one."""
        return Folder(self.join(name), self.storage)

    def _fs(self, name: str | None = None) -> tuple[Any, str, str]:
        """``(filesystem or None for plain local paths, path inside it, URL for messages)``."""
        where = self.location if name is None else self.join(name)
        if self.protocol is None:
            return None, where, where
        fs, path = self.storage.filesystem(where)
        if is_local(fs):
            return None, path, where
        return fs, path, where

    # -- reading -------------------------------------------------------------------

    def names(self) -> list[str]:
        """Names of the files and folders directly inside, sorted; none if it is absent."""
        fs, path, where = self._fs()
        if fs is None:
            try:
                return sorted(os.listdir(path))
            except (FileNotFoundError, NotADirectoryError):
                return []
        # Not ``refresh=True``: not every filesystem's ``ls`` takes it (sftp's does not).
        fs.invalidate_cache(path)
        try:
            entries = retrying(self.storage.retry, where, fs.ls, path, detail=True, what="list")
        except (FileNotFoundError, NotADirectoryError):
            return []
        prefix = path.rstrip("/") + "/"
        full = [str(entry["name"]).rstrip("/") for entry in entries]
        # A file at ``path`` itself lists as itself: only names under ``prefix`` count.
        return sorted({n[len(prefix) :].split("/", 1)[0] for n in full if n.startswith(prefix)})

    def read(self, name: str | None = None) -> bytes:
        """The bytes of file ``name`` (with None, of the file at the location itself).

        Raises:
            FileNotFoundError: There is no such file.
            RemoteIOError: A remote read failed through every retry.
        """
        fs, path, where = self._fs(name)
        if fs is None:
            with open(path, "rb") as handle:
                return handle.read()
        data: bytes = retrying(self.storage.retry, where, fs.cat_file, path, what="read")
        return data

    def is_file(self, name: str | None = None) -> bool:
        """Whether ``name`` inside this folder (or, with None, the location itself) is a file."""
        fs, path, where = self._fs(name)
        if fs is None:
            return os.path.isfile(path)
        fs.invalidate_cache(path)
        try:
            info = retrying(self.storage.retry, where, fs.info, path, what="look up")
        except (FileNotFoundError, NotADirectoryError):
            return False
        return info.get("type") == "file"

    # -- writing -------------------------------------------------------------------

    def write(self, name: str, data: bytes) -> str:
        """Write file ``name`` whole: a reader sees the old file, or none, or all of ``data``.

        Returns:
            The location written.

        Raises:
            RemoteIOError: A remote write failed through every retry, or the store
                refused it (no such bucket, no permission, a read-only filesystem).
        """
        fs, path, where = self._fs(name)
        if fs is None:
            _write_local(path, data)
            return where
        call = functools.partial(retrying, self.storage.retry, where)
        try:
            if self.protocol in ATOMIC_PUT_PROTOCOLS:
                call(fs.pipe_file, path, data, what="write")
            else:
                partial = f"{path}.{os.getpid()}{_TMP_SUFFIX}"
                call(
                    fs.makedirs, posixpath.dirname(path), exist_ok=True, what="create the folder of"
                )
                call(fs.pipe_file, partial, data, what="write")
                call(fs.mv, partial, path, what="rename")
        except FileNotFoundError as err:
            raise RemoteIOError(
                f"write {where} failed: its bucket or folder does not exist ({err})"
            ) from None
        except NotImplementedError:
            raise RemoteIOError(
                f"write {where} failed: the {self.protocol}:// filesystem cannot write"
            ) from None
        return where

    def delete(self, name: str) -> None:
        """Delete file ``name``; already gone is fine."""
        fs, path, where = self._fs(name)
        with contextlib.suppress(FileNotFoundError):
            if fs is None:
                os.remove(path)
            else:
                retrying(self.storage.retry, where, fs.rm_file, path, what="delete")

    def remove(self, first: tuple[str, ...] = ()) -> None:
        """Delete the folder and everything in it; already gone is fine.

        Locally the folder is first renamed out of view, so no reader ever lists it half
        deleted. An object store has no rename: the files named in ``first`` are deleted
        before the rest, so a reader that takes the folder's contents from those files
        (a checkpoint's completion markers) sees it incomplete from the first delete on.
        """
        fs, path, where = self._fs()
        if fs is None:
            parent, base = os.path.split(path.rstrip(os.sep))
            doomed = os.path.join(parent, f".removing-{base}-{os.getpid()}")
            try:
                os.rename(path, doomed)
            except FileNotFoundError:
                return
            shutil.rmtree(doomed, ignore_errors=True)
            return
        for name in first:
            self.delete(name)
        with contextlib.suppress(FileNotFoundError):
            retrying(self.storage.retry, where, fs.rm, path, recursive=True, what="delete")


def _write_local(path: str, data: bytes) -> None:
    """Temporary file beside ``path``, fsynced, renamed over it."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    partial = f"{path}.{os.getpid()}{_TMP_SUFFIX}"
    try:
        with open(partial, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
        raise
