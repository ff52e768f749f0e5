"""A data root's ``metadata.json`` (written by ``fmsdata tokenize``) and what it says about
the tokenizer: vocabulary size and the ids of its special tokens.

Training code that frames documents needs the BOS/EOS ids of the tokenizer that made the
data; guessing them (or copying another model's) frames every document with the wrong
tokens without any error. ``special_token_ids`` finds them by their usual names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fmsdata.errors import ConfigError

__all__ = [
    "EOS_NAMES",
    "METADATA_FILE",
    "read_metadata",
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


def read_metadata(root: str) -> dict[str, Any] | None:
    """``ROOT/metadata.json`` as a dict, or None when the root has none.

    Raises:
        ConfigError: The file exists but is not a JSON object.
    """
    from fmsdata.remote.storage import Storage

    fs, base = Storage().filesystem(root)
    path = f"{base}/{METADATA_FILE}"
    if not fs.exists(path):
        return None
    try:
        with fs.open(path, "rb") as handle:
            metadata = json.loads(handle.read())
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
