"""The ``remote`` section: how a remote root is reached, retried and cached."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fmsdata.config.section import Section, checked
from fmsdata.config.values import flag, number, optional_name
from fmsdata.errors import ConfigError

__all__ = ["RemoteConfig"]


def _options(field: str, value: Any) -> Mapping[str, Any] | None:
    if value is not None and not isinstance(value, Mapping):
        # The value itself may hold secrets: name its type only.
        raise ConfigError(
            f"{field} must be a mapping of fsspec options, got a {type(value).__name__}"
        )
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class RemoteConfig(Section):
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

    endpoint_url: str | None = checked(None, optional_name)
    aws_profile: str | None = checked(None, optional_name)
    anonymous: bool = checked(False, flag)
    storage_options: Mapping[str, Any] | None = checked(None, _options, repr=False)
    remote_cache_gb: float = checked(100.0, number(float, "positive", lambda gb: gb > 0))
    remote_retries: int = checked(8, number(int, "at least 1", lambda n: n >= 1))
    remote_backoff: float = checked(0.5, number(float, "in [0, 3600) s", lambda s: 0 <= s < 3600))
