"""A loader config completed by its data root: the one place a config meets ``metadata.json``.

A root that ``fmsdata tokenize`` wrote describes itself in ``metadata.json``: the format of
each dataset, the end-of-document token its documents already carry (``flat`` and
``pbin`` write one after every document), the tokenizer's special-token ids and its
vocabulary size. ``resolve_config`` takes from there what the config leaves unset and
refuses what contradicts it (``fmsdata.data.metadata.agree``), so that a config naming only
``data_path``, ``datasets``, ``seq_length`` and ``batch_size`` loads any tokenize output.
``build_dataloader`` (and through it ``fmsdata bench`` and the fms-fsdp drop-in) calls
it before building anything; ``get_dataset`` and ``fmsdata inspect`` apply the same
``root_facts`` / ``agree`` rules to their own arguments. ``root_token_ids`` gives a
training script the same facts before it builds a model: the BOS/EOS ids and the vocabulary
size, the ones it was given checked, the ones it was not read from the root.

Delimiters are never doubled: when the loader adds ``eos_token`` (or ``bos_token``) to
documents that already end (start) with it, the stored one is listed in ``strip_tokens``,
so each document is framed by exactly one. This holds for the formats that always keep
their end token (``npy`` flat streams, ``pbin``: ``FileHandler.documents_end_with_eos``)
with or without metadata, and for whatever ``metadata.json`` records. Where neither says
(``file_type: auto``, other formats without metadata), the first read of a file refuses a
delimiter most of its documents already carry (``fmsdata.data.delimiters``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fmsdata.config import DEFAULT_FILE_TYPE, LoaderConfig
from fmsdata.data.metadata import (
    METADATA_FILE,
    RootFacts,
    agree,
    check_file_type,
    check_vocab_size,
    read_metadata,
    root_facts,
)
from fmsdata.errors import ConfigError
from fmsdata.handlers import handler_class
from fmsdata.remote.storage import Storage

__all__ = ["CLI_TOKEN_OPTIONS", "TOKEN_FIELDS", "resolve_config", "root_token_ids"]


def resolve_config(config: LoaderConfig) -> LoaderConfig:
    """``config`` with the root's recorded settings filled in and delimiters made single.

    Fields taken from ``metadata.json`` when unset: ``file_type``, ``eos_token``,
    ``vocab_size``. Checked against it when set: those, ``bos_token`` (the tokenizer's
    BOS) and ``doc_separator`` (the datasets' end-of-document token). A root without
    ``metadata.json`` keeps the config as it is, with ``file_type`` defaulting to
    ``arrow``.

    Raises:
        ConfigError: A set field contradicts the metadata (the message names the field,
            both values and the file), or the metadata is unreadable.
    """
    data, documents = config.data, config.documents
    metadata = read_metadata(data.data_path, Storage.from_config(config.remote))
    path = f"{data.data_path.rstrip('/')}/{METADATA_FILE}"
    facts = root_facts(metadata, path, config.mix.datasets) if metadata else RootFacts(path)
    file_type = check_file_type(data.file_type, facts) or DEFAULT_FILE_TYPE
    eos = agree(
        "eos_token", documents.eos_token, facts.eos_token, path, "its end-of-document token"
    )
    if documents.bos_token is not None:
        agree("bos_token", documents.bos_token, facts.bos_token, path, "the tokenizer's BOS")
    if facts.documents_end_with_eos:
        # A flat stream is split on this token: another separator cuts other documents.
        agree("doc_separator", data.doc_separator, facts.eos_token, path, "it ends documents")
    vocab = check_vocab_size(config.output.vocab_size, facts)
    changes: dict[str, Any] = {}
    for name, value in (("file_type", file_type), ("eos_token", eos), ("vocab_size", vocab)):
        if value != getattr(config, name):
            changes[name] = value
    carried = set()
    if eos is not None and (
        facts.documents_end_with_eos or handler_class(file_type).documents_end_with_eos
    ):
        carried.add(eos)
    if documents.bos_token is not None and facts.documents_start_with_bos:
        carried.add(documents.bos_token)
    if carried - set(documents.strip_tokens):
        changes["strip_tokens"] = tuple(sorted({*documents.strip_tokens, *carried}))
    return config.replace(**changes) if changes else config


TOKEN_FIELDS = ("bos_token", "eos_token", "vocab_size")
# How command lines (the examples', fms-fsdp's scripts') spell those fields, for messages.
CLI_TOKEN_OPTIONS = {
    "bos_token": "--bos-token",
    "eos_token": "--eos-token",
    "vocab_size": "--vocab-size",
}


def root_token_ids(
    data_path: str,
    bos_token: int | None = None,
    eos_token: int | None = None,
    vocab_size: int | None = None,
    *,
    required: Sequence[str] = ("eos_token", "vocab_size"),
    option_names: Mapping[str, str] | None = None,
    storage: Storage | None = None,
) -> dict[str, int | None]:
    """``bos_token``, ``eos_token`` and ``vocab_size`` for a loader and a model over
    ``data_path``: each one given is checked against the root's ``metadata.json``, each one
    left None is read from it (the tokenizer's BOS, the datasets' end-of-document token, the
    tokenizer's vocabulary). A ``vocab_size`` larger than the recorded one is a model's
    padded embedding and is kept. A root without ``metadata.json`` (fms-fsdp / Bamba data)
    keeps what is given.

    This is what a training script calls on its command-line options, so that it runs on
    the output of ``fmsdata tokenize`` (and ``fmsdata demo``) with no ids given, and refuses
    ids that were given for other data::

        ids = root_token_ids(args.data, args.bos_token, args.eos_token, args.vocab_size)

    Args:
        data_path: The data root (local path or URL).
        bos_token, eos_token, vocab_size: What the user gave, None where nothing.
        required: The fields that must end up known (a BOS is optional: a tokenizer may
            have none).
        option_names: How the user names each field (e.g. ``{"eos_token": "--eos-token"}``),
            for the messages.
        storage: Remote settings for reading ``data_path``.

    Returns:
        ``{"bos_token": ..., "eos_token": ..., "vocab_size": ...}`` (None where neither
        the user nor the metadata says).

    Raises:
        ConfigError: A given value contradicts the metadata (naming the field, both values
            and the file), or a ``required`` field is neither given nor recorded.
    """
    names = {field: field for field in TOKEN_FIELDS} | dict(option_names or {})
    metadata = read_metadata(data_path, storage)
    path = f"{data_path.rstrip('/')}/{METADATA_FILE}"
    facts = root_facts(metadata, path) if metadata else RootFacts(path)

    bos = agree(names["bos_token"], bos_token, facts.bos_token, path, "the tokenizer's BOS")
    eos = agree(names["eos_token"], eos_token, facts.eos_token, path, "its end-of-document token")
    try:
        vocab = check_vocab_size(vocab_size, facts)
    except ConfigError:
        raise ConfigError(
            f"{names['vocab_size']} {vocab_size} is smaller than the vocabulary of the "
            f"tokenizer that made the data, {facts.vocab_size} ({path}): its token ids would "
            f"not fit; leave {names['vocab_size']} unset to use the recorded one"
        ) from None
    ids = {"bos_token": bos, "eos_token": eos, "vocab_size": vocab}
    missing = [names[field] for field in required if ids[field] is None]
    if missing:
        where = "its metadata.json records none" if metadata else "it has no metadata.json"
        raise ConfigError(
            f"{data_path}: {where}; give {' and '.join(missing)} (those of the tokenizer "
            "that made the data)"
        )
    return ids
