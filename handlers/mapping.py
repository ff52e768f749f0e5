"""Read-only memory maps of shard files whose resident pages can be given back.

Handlers read tokens as views of memory-mapped files. Pages touched through a mapping
count in the process's resident memory until unmapped, so a long run over many open files
would grow its RSS with the corpus; ``release`` drops them (the kernel keeps them in the
page cache, a later read maps them again) and keeps a worker's memory flat.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from fmsdata.errors import ShardFormatError

__all__ = ["MappedFile", "resident_file_bytes"]


class MappedFile:
    """A whole file mapped read-only; ``bytes`` is a uint8 view of it."""

    _CLOSED = np.empty(0, dtype=np.uint8)  # what ``bytes`` is after ``close``

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size == 0:
                raise ShardFormatError(f"{path}: file is empty")
            self._map: mmap.mmap | None = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        self.bytes = np.frombuffer(self._map, dtype=np.uint8)

    def view(self, dtype: np.dtype, offset: int = 0, count: int = -1) -> np.ndarray:
        """The file (from ``offset``) as an array of ``dtype`` (whole items only)."""
        if count < 0:
            count = (len(self.bytes) - offset) // np.dtype(dtype).itemsize
        return self.bytes[offset : offset + count * np.dtype(dtype).itemsize].view(dtype)

    def release(self) -> None:
        """Give back the resident pages of the mapping (contents stay readable)."""
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def close(self) -> np.ndarray:
        """Forget the mapping; it is unmapped once no array views of it remain.

        Returns the empty array ``bytes`` now is. Uses no module globals, so it also works
        when a reader is closed during interpreter shutdown.
        """
        self.bytes = self._CLOSED
        self._map = None
        return self._CLOSED


def resident_file_bytes() -> int | None:
    """Bytes of this process's resident memory backed by files (None off Linux)."""
    try:
        with open("/proc/self/statm") as statm:
            fields = statm.read().split()
    except OSError:
        return None
    return int(fields[2]) * os.sysconf("SC_PAGE_SIZE")
