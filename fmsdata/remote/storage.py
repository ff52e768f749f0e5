"""How to reach a data root: the filesystem of a URL, with the user's access options.

Any fsspec URL works (``s3://``, ``gs://``, ``file://``, ``memory://``, plain paths). For
S3 the endpoint, profile and anonymous access can be given; anything not given comes from
the usual AWS environment (``AWS_PROFILE``, ``AWS_ENDPOINT_URL``, credentials files,
instance roles), as boto does it. The client's own retries are turned off so that
``RetryPolicy`` alone decides how long a failing read is tried.

Credentials given through ``options`` live only in this object: its ``repr`` leaves them
out, nothing logs them, and loader states never hold a ``Storage``.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from typing import Any

import fsspec
from fsspec.registry import known_implementations
from fsspec.utils import get_protocol

from fmsdata.config import RemoteConfig
from fmsdata.errors import ConfigError
from fmsdata.remote.retry import RetryPolicy
from fmsdata.util.extras import PROTOCOL_PACKAGES, missing

__all__ = ["Storage", "is_local", "filesystem_class"]

_S3 = ("s3", "s3a")
_filesystems: dict[tuple[Any, ...], fsspec.AbstractFileSystem] = {}


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol or "local" in protocol


def filesystem_class(protocol: str, url: str) -> type[fsspec.AbstractFileSystem]:
    """fsspec's filesystem class for ``protocol``, or an error that says what to do.

    Raises:
        ConfigError: fsspec knows no such protocol (a typo such as ``htp://``).
        MissingDependencyError: The package implementing it is not installed; names the
            ``pip install`` command (``"fmsdata[s3]"`` for ``s3://``).
    """
    try:
        return fsspec.get_filesystem_class(protocol)
    except ImportError as err:
        # Else the package fsspec's registry names as implementing it (``adlfs`` ...).
        named = known_implementations.get(protocol, {}).get("class", protocol)
        package = PROTOCOL_PACKAGES.get(protocol) or named.split(".")[0]
        raise missing(package, f"reading {protocol}:// URLs ({url!r})", err) from None
    except ValueError:
        known = sorted(fsspec.available_protocols())
        close = difflib.get_close_matches(protocol, known, n=1)
        hint = f" (did you mean {close[0]}://?)" if close else ""
        raise ConfigError(
            f"{url!r}: unknown URL protocol {protocol!r}{hint}; use a local path or one of "
            f"fsspec's protocols, e.g. s3://, gs://, file://, http:// "
            f"(all: python -c 'import fsspec; print(fsspec.available_protocols())')"
        ) from None


@dataclasses.dataclass(frozen=True)
class Storage:
    """Access options and retry policy for data roots.

    Attributes:
        endpoint_url: S3-compatible endpoint (MinIO, Ceph, a local test server).
        profile: AWS profile name from the shared credentials/config files.
        anonymous: Unsigned requests (public buckets).
        options: Extra fsspec filesystem options (any backend); may hold secrets.
        retry: Tries and backoff of every remote call.
    """

    endpoint_url: str | None = None
    profile: str | None = None
    anonymous: bool = False
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    retry: RetryPolicy = RetryPolicy()

    @classmethod
    def from_config(cls, remote: RemoteConfig) -> Storage:
        """The storage a config's ``remote`` section asks for."""
        return cls(
            endpoint_url=remote.endpoint_url,
            profile=remote.aws_profile,
            anonymous=remote.anonymous,
            options=dict(remote.storage_options or {}),
            retry=RetryPolicy(tries=remote.remote_retries, backoff=remote.remote_backoff),
        )

    def filesystem(self, url: str) -> tuple[fsspec.AbstractFileSystem, str]:
        """``(filesystem, path inside it)`` of ``url``; one filesystem object per process."""
        protocol = get_protocol(url)
        kwargs: dict[str, Any] = dict(self.options)
        if protocol in _S3:
            given = dict(endpoint_url=self.endpoint_url, profile=self.profile, anon=self.anonymous)
            kwargs.update({key: value for key, value in given.items() if value})
            kwargs["config_kwargs"] = {
                "retries": {"max_attempts": 1, "mode": "standard"},
                "connect_timeout": 10,
                "read_timeout": 60,
                **(kwargs.get("config_kwargs") or {}),
            }
        cls = filesystem_class(protocol, url)
        path = cls._strip_protocol(url)
        key = (protocol, os.getpid(), repr(sorted(kwargs.items(), key=lambda kv: kv[0])))
        fs = _filesystems.get(key)
        if fs is None:
            fs = cls(**kwargs, skip_instance_cache=True) if protocol in _S3 else cls(**kwargs)
            if protocol in _S3:
                fs.retries = 1  # s3fs's own retry loop: one try; RetryPolicy does the rest
            _filesystems[key] = fs
        return fs, path.rstrip("/") if path != "/" else path
