"""Short digests of batches: what a training loop logs per step, and ``fmsdata trace
--verify`` derives again from the config and the data (a data-parity certificate).

A rank's digest is the first 8 bytes of the SHA-256 of its batch's ``input_ids`` then
``labels``, each as little-endian int32 values in row-major order (the same digest
whatever ``output_dtype``). A global step's digest combines its ranks' in rank order
(``combine_digests``). SHA-256 because processors compute it in hardware: about 140 us for
a batch of 8 x 4,096 tokens on the 2-core development machine
(``benchmarks/trace.py`` measures it), off the training thread when batches are pinned
ahead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["batch_digest", "digest_hex", "digest_int64", "combine_digests", "DIGEST_BYTES"]

DIGEST_BYTES = 8


def batch_digest(input_ids: Any, labels: Any) -> str:
    """The hex digest of one rank's batch (tensors or arrays of any integer dtype)."""
    digest = hashlib.sha256()
    for values in (input_ids, labels):
        digest.update(_int32_values(values).data)
    return digest.digest()[:DIGEST_BYTES].hex()


def digest_int64(hex_digest: str) -> int:
    """The digest as a signed 64-bit integer (what a batch's ``step_digest`` tensor holds:
    one ``all_gather`` collects every rank's)."""
    return int.from_bytes(bytes.fromhex(hex_digest), "little", signed=True)


def digest_hex(value: Any) -> str:
    """The hex digest of a ``step_digest`` value (a tensor, numpy or Python integer, or
    the hex string itself).

    Raises:
        ValueError: A string that is not 16 hex digits.
    """
    if isinstance(value, str):
        if len(value) != 2 * DIGEST_BYTES:
            raise ValueError(f"a digest is {2 * DIGEST_BYTES} hex digits, got {value!r}")
        return bytes.fromhex(value).hex()
    number = int(value.item() if hasattr(value, "item") else value)
    return (number & (2**64 - 1)).to_bytes(DIGEST_BYTES, "little").hex()


def combine_digests(digests: Sequence[Any]) -> str:
    """A global step's digest: its ranks' digests (in rank order, any form ``digest_hex``
    reads) combined."""
    combined = hashlib.sha256()
    for value in digests:
        combined.update(bytes.fromhex(digest_hex(value)))
    return combined.digest()[:DIGEST_BYTES].hex()


def _int32_values(values: Any) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().cpu().numpy()
    array = np.ascontiguousarray(values, dtype="<i4")
    return array
