"""The ``data`` section: where the shards are and how their files are read."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from fmsdata.config.section import Section, checked
from fmsdata.config.values import (
    flag,
    non_empty,
    optional_path,
    optional_token,
    set_field,
    split_csv,
)
from fmsdata.errors import ConfigError

__all__ = ["DataConfig", "DEFAULT_FILE_TYPE"]

# The format of a root whose metadata.json does not say (fms-fsdp's default).
DEFAULT_FILE_TYPE = "arrow"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig(Section):
    """The data root and the format options of its files: what the catalog lists and the
    format handler reads with (``fmsdata.data.dataformat.handler_for``). Which of the root's
    datasets are read is the ``mix`` section's ``datasets``.

    Attributes:
        data_path: Data root (local path or fsspec URL) holding one folder per dataset.
        file_type: Shard format name (see ``fmsdata.handlers``), or ``"auto"`` (by ending).
            Unset (None): the format the root's ``metadata.json`` records, else ``"arrow"``.
        col_name: Token column of Arrow/Parquet/MDS shards, or a comma list of candidate
            columns (``"tokens,input_ids"``): each file uses the first one it has, so an
            error comes only from a file that has none. A text column among a Parquet
            file's candidates is tokenized with ``tokenizer``.
        text_field: Text column or JSON field of text shards, tokenized while loading.
        tokenizer: ``tokenizer.json`` (Hugging Face ``tokenizers``) for text shards, a file
            on this machine.
        token_dtype: Token type of formats that do not record it (flat token files,
            MDS ``bytes`` columns), e.g. ``"uint16"``, ``"uint32"``.
        doc_separator: Token that ends documents in flat token files (default: eos_token).
        strict: Make malformed text records (bad JSON, missing field) an error instead of
            skipping and counting them.
        cache_dir: Where derived data goes (token caches of text shards, document
            indexes of flat token files, downloads), a folder on this machine; default
            ``$FMSDATA_CACHE`` or ``~/.cache/fmsdata``.
    """

    data_path: str
    file_type: str | None = checked(None, non_empty("a format name or unset", optional=True))
    col_name: str = "tokens"
    text_field: str = checked("text", non_empty("a non-empty name"))
    tokenizer: str | None = checked(None, optional_path)
    token_dtype: str | None = None
    doc_separator: int | None = checked(None, optional_token)
    strict: bool = checked(False, flag)
    cache_dir: str | None = checked(None, optional_path)

    def _check(self) -> None:
        if not isinstance(self.data_path, (str, os.PathLike)) or not str(self.data_path):
            raise ConfigError(f"data_path must be a non-empty path or URL, got {self.data_path!r}")
        set_field(self, "data_path", optional_path("data_path", self.data_path))
        columns = split_csv("col_name", self.col_name)
        if not columns or not all(columns):
            raise ConfigError(
                f"col_name must name a column or a comma list of them, got {self.col_name!r}"
            )
        set_field(self, "col_name", ",".join(columns))
        if self.token_dtype is not None:
            try:
                dtype = np.dtype(self.token_dtype)
            except TypeError:
                raise ConfigError(
                    f"token_dtype must be a numpy integer type, got {self.token_dtype!r}"
                ) from None
            if dtype.kind not in "iu":
                raise ConfigError(f"token_dtype must be an integer type, got {self.token_dtype!r}")
            set_field(self, "token_dtype", dtype.name)
