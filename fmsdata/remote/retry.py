"""Retrying remote calls: which failures are transient, and bounded exponential backoff.

Object stores fail transiently (5xx, throttling, dropped connections, timeouts) and the
clients raise a zoo of types for it (``OSError`` with an errno from s3fs, botocore and
aiohttp exceptions). ``retrying`` retries those with capped, jittered exponential backoff
and a warning per failed try (URL, try, cause, next wait); after the last try it raises
``RemoteIOError`` naming the URL and the cause. A missing
object is not transient: ``FileNotFoundError`` naming the URL, at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import random
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from fmsdata.errors import RemoteIOError
from fmsdata.remote import requests

__all__ = ["RetryPolicy", "is_transient", "retrying"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Exception type names (anywhere in the class hierarchy) of network-level failures, so that
# botocore and aiohttp need not be imported to recognize theirs.
_TRANSIENT_TYPES = {
    "HTTPClientError",  # botocore: ConnectionClosedError, ReadTimeoutError, ...
    "ConnectionError",  # botocore EndpointConnectionError and the builtin
    "ClientPayloadError",  # aiohttp: body cut short
    "ServerDisconnectedError",
    "ClientConnectionError",
    "ClientOSError",
    "IncompleteRead",
    "FSTimeoutError",
    "ResponseParserError",
    "ProtocolError",
    "FlexibleChecksumError",  # botocore: body does not match its checksum (corrupted on the way)
}
_TRANSIENT_ERRNOS = {
    errno.EREMOTEIO,  # s3fs: 5xx
    errno.EBUSY,  # s3fs: SlowDown / 503
    errno.EAGAIN,
    errno.ETIMEDOUT,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ECONNREFUSED,
    errno.EPIPE,
    errno.EIO,
}
_THROTTLE_CODES = {*"SlowDown Throttling ThrottlingException RequestTimeout InternalError".split()}


def is_transient(err: BaseException) -> bool:
    """Whether ``err`` is worth retrying (a network or server-side hiccup)."""
    if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(err, (TimeoutError, asyncio.TimeoutError, ConnectionError)):
        return True
    if {cls.__name__ for cls in type(err).__mro__} & _TRANSIENT_TYPES:
        return True
    if isinstance(err, OSError) and err.errno in _TRANSIENT_ERRNOS:
        return True
    response = getattr(err, "response", None)  # botocore ClientError
    if isinstance(response, dict):
        code = (response.get("Error") or {}).get("Code")
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0
        return code in _THROTTLE_CODES or status >= 500
    return False


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Tries and backoff of remote calls.

    Attributes:
        tries: Attempts in all (at least 1).
        backoff: Seconds before the second try; doubles each time, up to ``max_backoff``,
            with up to 50% random jitter so many workers do not retry in step.
        max_backoff: Cap of a single wait.
    """

    tries: int = 8
    backoff: float = 0.5
    max_backoff: float = 30.0

    def delay(self, attempt: int) -> float:
        """Wait after failed attempt number ``attempt`` (0-based)."""
        base = min(self.backoff * (2**attempt), self.max_backoff)
        return base * (1 + 0.5 * random.random())


def retrying(
    policy: RetryPolicy,
    url: str,
    call: Callable[..., T],
    *args: Any,
    what: str = "read",
    **kwargs: Any,
) -> T:
    """``call(*args, **kwargs)``, retried on transient failures (``what`` and ``url`` name
    the operation in messages).

    Raises:
        FileNotFoundError: The object does not exist (not retried).
        RemoteIOError: A transient failure persisted through every try, or a permanent one
            (permission, bad request) happened; names ``url`` and the cause.
    """
    tries = max(1, policy.tries)
    for attempt in range(tries):
        try:
            return _call(call, args, kwargs, what, url)
        except FileNotFoundError as err:
            raise FileNotFoundError(errno.ENOENT, f"no such object: {url}") from err
        except (NotADirectoryError, IsADirectoryError):
            raise
        except Exception as err:
            cause = f"{type(err).__name__}: {err}"
            if not is_transient(err):
                raise RemoteIOError(f"{what} {url} failed: {cause}") from err
            if attempt == tries - 1:
                raise RemoteIOError(
                    f"{what} {url} failed after {tries} tries; last error {cause}"
                ) from err
            wait = policy.delay(attempt)
            # A warning, not info: an unreachable endpoint otherwise sits silent for a minute.
            logger.warning(
                "%s %s failed (try %d of %d): %s; retrying in %.1fs",
                what,
                url,
                attempt + 1,
                tries,
                cause,
                wait,
            )
            time.sleep(wait)
    raise AssertionError("unreachable")


def _call(call: Callable[..., T], args: Any, kwargs: Any, what: str, url: str) -> T:
    """``call(*args, **kwargs)``, counted (``fmsdata.remote.requests``: every try is a
    request); an error it raises is re-raised with the locals of its traceback's finished
    frames dropped (the traceback still prints).

    fsspec's ``sync`` re-raises the error of the coroutine from a list its own frame
    holds: a reference cycle through the traceback. The traceback also holds the frames
    it passed through on its way out, and each of those its caller's, up to the caller of
    a loader's ``build_dataloader`` (a missing ``metadata.json`` is such an error): the
    loader, its dataset and its DataLoader workers then stayed alive until the cyclic
    garbage collector ran, long after the user dropped them.
    """
    try:
        result = call(*args, **kwargs)
    except BaseException as err:
        requests.note(what, url, None)
        traceback.clear_frames(err.__traceback__)
        raise
    requests.note(what, url, result)
    return result
