"""Paths a user gives that look like URLs: the one check every path-taking entry runs.

A value is a URL when it starts with ``scheme://``. Without this check, ``s3://bucket/x``
handed to ``os.makedirs`` becomes a local folder named ``s3:`` and every write "succeeds"
on the wrong disk. So each place that takes a path says which kind it is:

- ``location(value, what)``: a place fmsdata reaches through fsspec as well as on local
  disk (data roots, loader checkpoint folders). A plain path or a URL of a protocol
  fsspec knows is returned unchanged; an unknown protocol (a typo such as ``s4://``), an
  fsspec chain (``simplecache::s3://``) or, for a place that is written, a read-only
  protocol (``http://``) is a ``ConfigError`` naming ``what`` and the value. Whether the
  protocol's package is installed is checked where the filesystem is first used
  (``fmsdata.remote.storage.filesystem_class`` names the ``pip install`` fix).
- ``local_path(value, what)``: a path that must be on this machine (caches, tokenizers,
  output folders, config files, plots). A plain path is returned unchanged, a ``file://``
  URL as its path; any other URL is a ``ConfigError`` naming ``what`` and the value.

Nothing here imports fsspec unless a value is a URL.
"""

from __future__ import annotations

import os
import re
from typing import Any

from fmsdata.errors import ConfigError

__all__ = ["url_scheme", "is_url", "location", "local_path", "READ_ONLY_PROTOCOLS"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*$")

# fsspec protocols that only read: a place fmsdata writes (a checkpoint folder) cannot be
# one of them.
READ_ONLY_PROTOCOLS = frozenset(
    {"http", "https", "github", "git", "zip", "tar", "libarchive", "reference", "jlab", "dbfs"}
)


def url_scheme(value: Any) -> str | None:
    """The scheme of a ``scheme://...`` value (as written), else None (a plain path).

    Anything before the first ``://`` that holds no path separator counts, so a
    malformed scheme (``s 3://``) or an fsspec chain (``simplecache::s3://``) is still
    recognised as a URL, and refused, rather than taken for a local path.
    """
    if not isinstance(value, (str, os.PathLike)):
        return None
    text = os.fspath(value)
    if not isinstance(text, str):
        return None
    head, sep, _ = text.partition("://")
    if not sep or not head or "/" in head or "\\" in head:
        return None
    return head


def is_url(value: Any) -> bool:
    """Whether ``value`` is a ``scheme://`` URL (``file://`` included)."""
    return url_scheme(value) is not None


def _said(what: str | None, text: str) -> str:
    """How a message starts: the field or argument and the value (the value alone where
    the caller names the field itself, as argparse does)."""
    return f"{what}={text!r}" if what else repr(text)


def location(value: str | os.PathLike[str], what: str | None, write: bool = False) -> str:
    """``value`` as a place fmsdata may reach on local disk or through fsspec.

    Args:
        value: A local path or a URL.
        what: The field or argument it came from, for the message (``checkpoint_dir``,
            ``save_loader_state(ckpt_dir)``); None where the caller names it itself.
        write: The place is written (a checkpoint folder): read-only protocols are refused.

    Raises:
        ConfigError: A URL whose protocol fsspec does not know, a chain of protocols, or
            a read-only protocol where ``write``; names ``what`` and ``value``.
    """
    text = os.fspath(value)
    scheme = url_scheme(text)
    if scheme is None:
        return text
    protocol = scheme.lower()
    if "::" in protocol or not _SCHEME.match(protocol):
        raise ConfigError(
            f"{_said(what, text)}: {scheme!r} is not a URL protocol fmsdata can use (chained "
            "fsspec URLs such as simplecache::s3:// are not supported); give a local path or "
            "a URL such as s3://bucket/prefix"
        )
    import fsspec

    known = fsspec.available_protocols()
    if protocol not in known:
        import difflib

        close = difflib.get_close_matches(protocol, known, n=1)
        hint = f" (did you mean {close[0]}://?)" if close else ""
        raise ConfigError(
            f"{_said(what, text)}: unknown URL protocol {scheme!r}{hint}; give a local path or a "
            "URL of one of fsspec's protocols, e.g. s3://, gs://, file://"
        )
    if write and protocol in READ_ONLY_PROTOCOLS:
        raise ConfigError(
            f"{_said(what, text)}: fmsdata writes here, and {scheme}:// is read-only; give a "
            "local path or a writable URL such as s3://bucket/prefix"
        )
    return text


def local_path(value: str | os.PathLike[str], what: str | None, hint: str = "") -> str:
    """``value`` as a path on this machine: plain paths unchanged, ``file://`` URLs as
    their path.

    Args:
        value: What the user gave.
        what: The field or argument it came from, for the message; None where the caller
            names it itself.
        hint: What to do instead, appended to the message (e.g. download it first).

    Raises:
        ConfigError: Any other URL; names ``what`` and ``value``.
    """
    text = os.fspath(value)
    scheme = url_scheme(text)
    if scheme is None:
        return text
    if scheme.lower() == "file":
        return text[len("file://") :] or "/"
    raise ConfigError(
        f"{_said(what, text)}: must be a path on this machine; {scheme}:// URLs are not "
        "supported here" + (f"; {hint}" if hint else "")
    )
