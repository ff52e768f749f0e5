"""Command-line options that say how to reach a remote root (shared by every command)."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from fmsdata.cli.parser import positive_int

if TYPE_CHECKING:
    from fmsdata.remote.storage import Storage

__all__ = ["add_storage_options", "storage_from_args", "remote_cache_dir"]


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("remote storage (s3:// and other fsspec URLs)")
    group.add_argument("--endpoint-url", help="S3-compatible endpoint (default: AWS environment)")
    group.add_argument("--profile", help="AWS profile (default: AWS_PROFILE / default)")
    group.add_argument("--anonymous", action="store_true", help="unsigned requests")
    group.add_argument("--retries", type=positive_int, default=8, help="tries of each remote read")
    group.add_argument(
        "--backoff", type=float, default=0.5, help="seconds before the first retry (doubles)"
    )


def storage_from_args(args: argparse.Namespace) -> Storage:
    from fmsdata.remote.retry import RetryPolicy
    from fmsdata.remote.storage import Storage

    return Storage(
        endpoint_url=args.endpoint_url,
        profile=args.profile,
        anonymous=args.anonymous,
        retry=RetryPolicy(tries=max(1, args.retries), backoff=max(0.0, args.backoff)),
    )


def remote_cache_dir() -> str:
    from fmsdata.handlers.derived import default_cache_dir

    return os.path.join(default_cache_dir(), "remote")
