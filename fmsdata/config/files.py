"""Config text from outside: YAML files and ``key=value`` overrides, as plain mappings."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from fmsdata.errors import ConfigError
from fmsdata.util.urls import local_path

__all__ = ["read_yaml", "parse_overrides", "FMS_WRAPPER"]

# fms-fsdp style files hold the loader's fields under one top-level key of this name.
FMS_WRAPPER = "data"


def read_yaml(path: str | os.PathLike[str]) -> Mapping[str, Any]:
    """The mapping a loader config file holds.

    A file whose only top-level key is ``data:`` (fms-fsdp's wrapper) gives what is under
    it. A sectioned file with only its ``data:`` section gives the same: that section holds
    only ``data`` fields, which read the same flat as in their section.

    Raises:
        ConfigError: The file is unreadable, not YAML, empty, or not a mapping, or ``path``
            is a URL (config files are read from this machine); the message names the file
            and shows how a config is written.
    """
    where = local_path(path, "config file")
    try:
        with open(where, encoding="utf-8") as handle:
            values = yaml.safe_load(handle)
    except OSError as err:
        raise ConfigError(f"cannot read config file {where!r}: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {where!r} is not valid YAML: {err}") from None
    if values is None:
        raise ConfigError(
            f"config file {where!r} is empty; write the loader's fields as a YAML mapping, "
            "e.g. 'data_path: /data/root' and 'seq_length: 4096' on lines of their own"
        )
    if isinstance(values, Mapping) and set(values) == {FMS_WRAPPER}:
        values = values[FMS_WRAPPER]
    if not isinstance(values, Mapping):
        kind = "list" if isinstance(values, list) else type(values).__name__
        shown = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
        raise ConfigError(
            f"config file {where!r} holds {shown} at its top level, but a loader config is a "
            "mapping of field: value; write one field per line without a leading '- ', "
            "e.g. 'data_path: /data/root' and 'seq_length: 4096'"
        )
    return values


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """Parse ``["seq_length=2048", "datasets=a,b"]`` into a dict of typed values."""
    parsed: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = str(item).partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override must look like key=value, got {item!r}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        parsed[key.strip()] = value
    return parsed
