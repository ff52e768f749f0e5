"""A data root's ``metadata.json`` (written by ``fmsdata tokenize``) and what it says about
reading the root: the tokenizer's vocabulary size and special-token ids, and per dataset
the format and the delimiters its documents already carry.

Training code that frames documents needs the BOS/EOS ids of the tokenizer that made the
data; guessing them (or copying another model's) frames every document with the wrong
tokens without any error. ``special_token_ids`` finds them by their usual names;
``root_facts`` gathers what the file says about a set of datasets, and ``agree`` is the one
rule every reader applies to a setting the user gave: unset takes the recorded value, a
different value is a ``ConfigError`` naming the field, both values and the file.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fmsdata.errors import ConfigError

if TYPE_CHECKING:
    from fmsdata.remote.storage import Storage

__all__ = [
    "EOS_NAMES",
    "FORMAT_FILE_TYPES",
    "METADATA_FILE",
    "RootFacts",
    "agree",
    "check_file_type",
    "check_vocab_size",
    "read_metadata",
    "root_facts",
    "special_token_ids",
    "vocab_size",
    "SPECIAL_NAMES",
]

METADATA_FILE = "metadata.json"

# Role -> the names tokenizers give that token (bundled, Llama, GPT-2, BERT, T5 styles).
# The names tokenizers give their end-of-document token, most common first: how a root's
# metadata (or ``fmsdata tokenize``) finds the EOS id when none is given.
EOS_NAMES = ("<|eos|>", "</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "[EOS]")

SPECIAL_NAMES = {
    "bos": ("<|bos|>", "<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>", "[CLS]"),
    "eos": ("<|eos|>", "</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>", "[EOS]", "[SEP]"),
    "pad": ("<|pad|>", "<pad>", "[PAD]"),
}


# The formats a root's datasets record (``tokenize --format``, plus the names fmsdata's own
# handlers go by) -> the ``file_type`` that reads them.
FORMAT_FILE_TYPES = {
    "arrow": "arrow",
    "megatron": "megatron",
    "flat": "npy",
    "npy": "npy",
    "pbin": "pbin",
    "mds": "mds",
    "cepe": "cepe",
}


def read_metadata(root: str, storage: Storage | None = None) -> dict[str, Any] | None:
    """``ROOT/metadata.json`` as a dict, or None when the root has none.

    Raises:
        ConfigError: The file exists but is not a JSON object.
    """
    from fmsdata.remote.retry import retrying
    from fmsdata.remote.storage import Storage

    storage = storage or Storage()
    fs, base = storage.filesystem(root)
    path = f"{base}/{METADATA_FILE}"
    # Through the retry policy, as every remote read: an unreachable endpoint is a
    # RemoteIOError naming the URL after the configured tries, never a raw client error.
    url = f"{root.rstrip('/')}/{METADATA_FILE}"
    try:
        data = retrying(storage.retry, url, fs.cat_file, path)
    except FileNotFoundError:
        return None
    try:
        metadata = json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise ConfigError(f"{root}/{METADATA_FILE} is not valid JSON: {err}") from None
    if not isinstance(metadata, dict):
        raise ConfigError(
            f"{root}/{METADATA_FILE} holds a {type(metadata).__name__}, not a JSON object"
        )
    return metadata


def special_token_ids(metadata: Mapping[str, Any]) -> dict[str, int]:
    """``{"bos": id, "eos": id, "pad": id}`` for the roles whose token the tokenizer has."""
    tokens = (metadata.get("tokenizer") or {}).get("special_tokens") or {}
    found = {}
    for role, names in SPECIAL_NAMES.items():
        for name in names:
            if isinstance(tokens.get(name), int):
                found[role] = tokens[name]
                break
    return found


def vocab_size(metadata: Mapping[str, Any]) -> int | None:
    """The tokenizer's vocabulary size (added tokens included), when recorded."""
    size = (metadata.get("tokenizer") or {}).get("vocab_size")
    return size if isinstance(size, int) else None


@dataclasses.dataclass(frozen=True)
class RootFacts:
    """What a root's ``metadata.json`` records about reading some of its datasets.

    Each attribute is None where the file records nothing about it.

    Attributes:
        path: The metadata file, named in every error about a contradiction.
        file_type: The handler reading the datasets' format (``auto`` when they differ).
        formats: Dataset name -> the format it records, for messages.
        eos_token: The end-of-document id: the datasets' own, else the tokenizer's EOS.
        bos_token: The tokenizer's BOS id.
        documents_end_with_eos: Some dataset's stored documents already end with
            ``eos_token`` (``tokenize --format flat|pbin`` write it after every document).
        documents_start_with_bos: Some dataset's stored documents already start with
            ``bos_token``.
        vocab_size: The tokenizer's vocabulary size (added tokens included).
    """

    path: str
    file_type: str | None = None
    formats: Mapping[str, str] = dataclasses.field(default_factory=dict)
    eos_token: int | None = None
    bos_token: int | None = None
    documents_end_with_eos: bool | None = None
    documents_start_with_bos: bool | None = None
    vocab_size: int | None = None


def root_facts(
    metadata: Mapping[str, Any], path: str, datasets: Sequence[str] | None = None
) -> RootFacts:
    """What ``metadata`` (read from ``path``) says about ``datasets`` (default: every
    dataset it describes). Format facts come only when every named dataset is described
    (a hand-copied folder beside tokenize output may hold anything); tokenizer facts hold
    for the whole root (``tokenize`` refuses to mix tokenizers in one root).

    Raises:
        ConfigError: The named datasets record different end-of-document tokens.
    """
    described = metadata.get("datasets")
    described = described if isinstance(described, Mapping) else {}
    names = list(datasets) if datasets is not None else sorted(described)
    entries = {n: described[n] for n in names if isinstance(described.get(n), Mapping)}
    if len(entries) < len(names) or not entries:
        entries = {}
    formats = {n: str(e["format"]) for n, e in entries.items() if e.get("format")}
    file_type = None
    types = {FORMAT_FILE_TYPES.get(f) for f in formats.values()}
    if formats and len(formats) == len(entries) and None not in types:
        file_type = types.pop() if len(types) == 1 else "auto"
    specials = special_token_ids(metadata)
    own_eos = {n: e["eos_token"] for n, e in entries.items() if isinstance(e.get("eos_token"), int)}
    if len(set(own_eos.values())) > 1:
        listed = ", ".join(f"{n}: {t}" for n, t in sorted(own_eos.items()))
        raise ConfigError(
            f"{path}: the datasets record different end-of-document tokens ({listed}); "
            "load them with separate loaders, or tokenize them with one --eos-token"
        )
    ends = [bool(e.get("documents_end_with_eos")) for e in entries.values()]
    starts = [bool(e.get("documents_start_with_bos")) for e in entries.values()]
    return RootFacts(
        path=path,
        file_type=file_type,
        formats=formats,
        eos_token=next(iter(own_eos.values()), specials.get("eos")),
        bos_token=specials.get("bos"),
        documents_end_with_eos=any(ends) if ends else None,
        documents_start_with_bos=any(starts) if starts else None,
        vocab_size=vocab_size(metadata),
    )


def agree(field: str, configured: Any, recorded: Any, path: str, how: str = "") -> Any:
    """The value of setting ``field``: ``configured`` when given, else ``recorded``.

    Raises:
        ConfigError: Both are given and differ; the message names the field, both values
            and the metadata file (``how`` says what the recorded value is, if useful).
    """
    if configured is None:
        return recorded
    if recorded is None or configured == recorded:
        return configured
    raise ConfigError(
        f"{field}={configured!r} contradicts {path}, which records {recorded!r}"
        f"{f' ({how})' if how else ''}: leave {field} unset to use the recorded value, or "
        "point at the data this setting was written for"
    )


def check_file_type(configured: str | None, facts: RootFacts) -> str | None:
    """The file type to read the root with: ``configured`` when set (``auto`` reads
    anything), else the recorded one (``auto`` for datasets of several formats; None when
    neither says).

    Raises:
        ConfigError: ``configured`` cannot read a format the metadata records.
    """
    recorded = facts.file_type
    if configured in (None, "auto") or recorded is None:
        return configured or recorded
    if all(FORMAT_FILE_TYPES[fmt] == configured for fmt in facts.formats.values()):
        return configured
    formats = ", ".join(f"{name}: {fmt}" for name, fmt in sorted(facts.formats.items()))
    raise ConfigError(
        f"file_type={configured!r} contradicts {facts.path}, which records {recorded!r} "
        f"(the format of dataset {formats}): leave file_type unset to use the recorded one"
    )


def check_vocab_size(configured: int | None, facts: RootFacts) -> int | None:
    """The vocabulary bound: ``configured`` when set, else the recorded one.

    Raises:
        ConfigError: ``configured`` is smaller than the recorded tokenizer's vocabulary, so
            token ids the data may hold would be refused. A larger one is a model's padded
            embedding (e.g. 50304 for a 50257-token tokenizer) and is accepted.
    """
    recorded = facts.vocab_size
    if configured is None or recorded is None or configured >= recorded:
        return configured if configured is not None else recorded
    raise ConfigError(
        f"vocab_size={configured} contradicts {facts.path}, which records {recorded} (the "
        f"vocabulary of the tokenizer that made the data, whose ids reach {recorded - 1}): "
        "leave vocab_size unset to use the recorded one, or give at least that"
    )
