"""The ``remote`` section: how a remote root is reached, retried and cached."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fmsdata.config.values import flag, optional_name, set_field, to_number
from fmsdata.errors import ConfigError

__all__ = ["RemoteConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RemoteConfig:
    """Access options of ``s3://`` and other fsspec roots (``fmsdata.remote.storage``)
    and the local cache of their files. A local root ignores them.

    Attributes:
        endpoint_url: S3-compatible endpoint of ``s3://`` roots (default: the AWS
            environment, e.g. ``AWS_ENDPOINT_URL``, else AWS itself).
        aws_profile: AWS profile of ``s3://`` roots (default: ``AWS_PROFILE`` / default).
        anonymous: Unsigned requests to ``s3://`` roots (public buckets).
        storage_options: Extra fsspec filesystem options for the root (any backend). May
            hold credentials: they are never logged nor saved in a loader state.
        remote_cache_gb: Size the local cache of a remote root's files is trimmed to
            (files being read always stay).
        remote_retries: Tries of a remote read before ``RemoteIOError``.
        remote_backoff: Seconds before the first retry (doubling, capped at 30 s).
    """

    endpoint_url: str | None = None
    aws_profile: str | None = None
    anonymous: bool = False
    storage_options: Mapping[str, Any] | None = dataclasses.field(default=None, repr=False)
    remote_cache_gb: float = 100.0
    remote_retries: int = 8
    remote_backoff: float = 0.5

    def __post_init__(self) -> None:
        for name in ("endpoint_url", "aws_profile"):
            optional_name(name, getattr(self, name))
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            # The value itself may hold secrets: name its type only.
            raise ConfigError(
                "storage_options must be a mapping of fsspec options, "
                f"got a {type(self.storage_options).__name__}"
            )
        size = to_number("remote_cache_gb", self.remote_cache_gb, float)
        if not size > 0:
            raise ConfigError(f"remote_cache_gb must be positive, got {self.remote_cache_gb!r}")
        set_field(self, "remote_cache_gb", size)
        tries = to_number("remote_retries", self.remote_retries, int)
        if tries < 1:
            raise ConfigError(f"remote_retries must be at least 1, got {self.remote_retries!r}")
        set_field(self, "remote_retries", tries)
        backoff = to_number("remote_backoff", self.remote_backoff, float)
        if not 0 <= backoff < 3600:
            raise ConfigError(f"remote_backoff must be in [0, 3600) s, got {self.remote_backoff!r}")
        set_field(self, "remote_backoff", backoff)
        flag("anonymous", self.anonymous)
