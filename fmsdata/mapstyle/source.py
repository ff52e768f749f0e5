"""What ``get_dataset(metadata, ...)`` points at: a data root, its files' format, its EOS.

``metadata`` is a semantic name (a folder under ``$FMSDATA_DATA_DIR``), a metadata file
(``metadata.json``, or tatm's ``metadata.yaml``) or a data root folder, local or remote.
Two metadata layouts are read: fmsdata's (written by ``fmsdata tokenize``: ``datasets``
with each one's ``format``, ``tokenizer`` with the bundled ``file`` and its special tokens)
and tatm's (``tokenized_info``: ``file_prefix``, ``file_extension``, ``dtype``,
``vocab_size``; files ``{file_prefix}*.{file_extension}``, EOS after every document).
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
from typing import Any

import yaml

from fmsdata.data.metadata import (
    EOS_NAMES,
    FORMAT_FILE_TYPES,
    agree,
    check_file_type,
    check_vocab_size,
    root_facts,
)
from fmsdata.errors import ConfigError
from fmsdata.remote.storage import Storage
from fmsdata.util.urls import is_url, location

__all__ = [
    "RootSpec",
    "resolve_root",
    "find_root_metadata",
    "DATA_DIR_ENV",
    "EOS_NAMES",
    "FORMAT_FILE_TYPES",
]

DATA_DIR_ENV = "FMSDATA_DATA_DIR"
METADATA_FILES = ("metadata.json", "metadata.yaml", "metadata.yml")


@dataclasses.dataclass(frozen=True)
class RootSpec:
    """A data root as the map-style dataset reads it.

    Attributes:
        root: Path or URL of the root.
        metadata: Its parsed metadata file ({} when it has none).
        datasets: Dataset folders to read, in order (None: every folder of the root).
        prefix: tatm roots: the files are ``{prefix}*{suffix}`` directly in the root.
        suffix: File ending of a tatm root.
        file_type: Format handler (``auto`` picks one per file by its ending).
        options: Handler options (``col_name``, ``token_dtype``, ``separator``, ...).
        eos_token: End-of-document token (None when neither metadata nor user gave one).
        ends_with_eos: Whether stored documents already end with it (None: by format).
        check_stored_eos: Whether files an EOS is added to are sampled for documents that
            already end with it (refused; see ``files.check_stored_eos``). False only where
            the caller said ``documents_end_with_eos=False``.
        vocab_size: Given, else from the metadata's tokenizer (None if unknown).
        tokenizer_file: Path or URL of the tokenizer bundled with the root, if any.
    """

    root: str
    metadata: dict[str, Any]
    datasets: tuple[str, ...] | None
    prefix: str | None
    suffix: str | None
    file_type: str
    options: dict[str, Any]
    eos_token: int | None
    ends_with_eos: bool | None
    check_stored_eos: bool
    vocab_size: int | None
    tokenizer_file: str | None


def _locate(metadata: str, storage: Storage) -> str:
    """A name under ``$FMSDATA_DATA_DIR`` -> its folder; paths and URLs as they are (a URL
    of a protocol fsspec does not know is refused by name)."""
    if is_url(metadata):
        return location(metadata, "metadata")
    if metadata.startswith(("/", ".", "~")):
        return os.path.expanduser(metadata)
    if os.path.exists(metadata):
        return metadata
    base = os.environ.get(DATA_DIR_ENV)
    if not base:
        raise ConfigError(
            f"metadata {metadata!r} is neither a path nor a URL, and ${DATA_DIR_ENV} (the "
            "folder of named data roots) is not set"
        )
    base = location(base, f"${DATA_DIR_ENV}")
    target = posixpath.join(base.rstrip("/"), metadata)
    fs, path = storage.filesystem(target)
    if not fs.exists(path):
        fs_base, base_path = storage.filesystem(base)
        names = (
            sorted(posixpath.basename(p.rstrip("/")) for p in fs_base.ls(base_path, detail=False))
            if fs_base.isdir(base_path)
            else []
        )
        raise ConfigError(
            f"no dataset named {metadata!r} under ${DATA_DIR_ENV}={base}; it holds {names}"
        )
    return target


def _read_metadata(path: str, storage: Storage) -> dict[str, Any]:
    fs, local = storage.filesystem(path)
    text = fs.cat_file(local).decode("utf-8")
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: not readable metadata ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: metadata must be a mapping, got {type(data).__name__}")
    return data


def _root_and_metadata(target: str, storage: Storage) -> tuple[str, dict[str, Any], str]:
    """``(root, metadata, metadata file)``; ``{}`` and ``""`` for a root without one."""
    fs, path = storage.filesystem(target)
    if fs.isfile(path):
        root = target.rstrip("/").rsplit("/", 1)[0] if "/" in target else "."
        return root, _read_metadata(target, storage), target
    if not fs.isdir(path):
        raise ConfigError(f"metadata {target!r} does not exist")
    for name in METADATA_FILES:
        if fs.isfile(f"{path}/{name}"):
            where = posixpath.join(target.rstrip("/"), name)
            return target, _read_metadata(where, storage), where
    return target, {}, ""


def _eos_from_tokenizer(info: dict[str, Any]) -> int | None:
    special = info.get("special_tokens") or {}
    for name in EOS_NAMES:
        if name in special:
            return int(special[name])
    return None


def resolve_root(
    metadata: str | os.PathLike,
    storage: Storage,
    *,
    datasets: list[str] | None = None,
    file_type: str | None = None,
    eos_token: int | None = None,
    vocab_size: int | None = None,
    options: dict[str, Any] | None = None,
    documents_end_with_eos: bool | None = None,
) -> RootSpec:
    """The root ``metadata`` names, with what its metadata says about reading it. Arguments
    left None take the recorded values; given ones must agree with fmsdata metadata
    (``fmsdata.data.metadata.agree``, the rule the loader applies to its config). tatm metadata
    records no ``documents_end_with_eos``: its files store the EOS unless the caller says
    they do not.

    Raises:
        ConfigError: Unknown name, missing path, unreadable metadata, unknown dataset, an
            argument that contradicts the metadata (naming both values and the file).
    """
    root, meta, where = _root_and_metadata(_locate(os.fspath(metadata), storage), storage)
    options = {k: v for k, v in (options or {}).items() if v is not None}
    recorded = meta.get("tokenizer")
    tokenizer: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    tokenizer_file = (
        posixpath.join(root.rstrip("/"), tokenizer["file"]) if tokenizer.get("file") else None
    )
    prefix = suffix = None
    ends_with_eos = documents_end_with_eos
    described = meta.get("datasets")
    if isinstance(described, dict) and described:
        names = list(datasets) if datasets is not None else sorted(described)
        unknown = [n for n in names if n not in described]
        if unknown:
            raise ConfigError(
                f"{root}: metadata describes datasets {sorted(described)}, not {unknown}"
            )
        facts = root_facts(meta, where, names)
        file_type = check_file_type(file_type, facts) or "auto"
        cols = {described[n].get("col_name") for n in names} - {None}
        if len(cols) == 1:
            options.setdefault("col_name", cols.pop())
        ends_with_eos = agree(
            "documents_end_with_eos",
            documents_end_with_eos,
            facts.documents_end_with_eos,
            where,
            "whether its stored documents end with the EOS",
        )
        eos_token = agree(
            "eos_token", eos_token, facts.eos_token, where, "its end-of-document token"
        )
        vocab_size = check_vocab_size(vocab_size, facts)
        datasets = names
    elif isinstance(meta.get("tokenized_info"), dict):
        info = meta["tokenized_info"]
        file_prefix = str(info.get("file_prefix") or "")
        if not file_prefix:
            raise ConfigError(f"{root}: tokenized_info has no file_prefix")
        # tatm stores an absolute prefix; a root that moved keeps its files beside the metadata.
        base = posixpath.basename(file_prefix)
        prefix, suffix = base, "." + str(info.get("file_extension") or "bin").lstrip(".")
        file_type = file_type or "npy"
        options.setdefault("token_dtype", info.get("dtype") or "uint16")
        vocab_size = vocab_size or info.get("vocab_size")
        ends_with_eos = True if documents_end_with_eos is None else documents_end_with_eos
        fs, path = storage.filesystem(root)
        if tokenizer_file is None and fs.isfile(f"{path}/tokenizer.json"):
            tokenizer_file = posixpath.join(root.rstrip("/"), "tokenizer.json")
        datasets = None
    if vocab_size is None:
        vocab_size = tokenizer.get("vocab_size")
    if eos_token is None:
        eos_token = _eos_from_tokenizer(tokenizer)
    if eos_token is None and tokenizer_file is not None:
        eos_token = _eos_from_tokenizer_file(tokenizer_file, storage)
    return RootSpec(
        root=root,
        metadata=meta,
        datasets=tuple(datasets) if datasets is not None else None,
        prefix=prefix,
        suffix=suffix,
        file_type=file_type or "auto",
        options=options,
        eos_token=eos_token,
        ends_with_eos=ends_with_eos,
        check_stored_eos=documents_end_with_eos is not False,
        vocab_size=int(vocab_size) if vocab_size is not None else None,
        tokenizer_file=tokenizer_file,
    )


def _eos_from_tokenizer_file(path: str, storage: Storage) -> int | None:
    fs, local = storage.filesystem(path)
    try:
        data = json.loads(fs.cat_file(local))
    except (OSError, ValueError):
        return None
    added = {t.get("content"): t.get("id") for t in data.get("added_tokens") or []}
    for name in EOS_NAMES:
        if added.get(name) is not None:
            return int(added[name])
    return None


def find_root_metadata(
    path: str, storage: Storage, levels: int = 4
) -> tuple[str, dict[str, Any]] | None:
    """The data root holding ``path`` (a root, a dataset folder or a file under it) and
    its ``metadata.json``: the nearest folder at or above ``path`` that has one."""
    fs, local = storage.filesystem(path)
    url = path.rstrip("/")
    if fs.isfile(local):
        url, local = url.rsplit("/", 1)[0] if "/" in url else ".", posixpath.dirname(local)
    for _ in range(levels):
        if fs.isfile(f"{local}/metadata.json"):
            return url, _read_metadata(posixpath.join(url, "metadata.json"), storage)
        parent = posixpath.dirname(local)
        if parent == local or "/" not in url:
            return None
        url, local = url.rsplit("/", 1)[0], parent
    return None
