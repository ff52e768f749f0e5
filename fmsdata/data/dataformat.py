"""The format handler a config's ``data`` section asks for: the data layer's side of the
handler registry (``fmsdata.handlers``), which itself knows nothing of the config."""

from __future__ import annotations

from fmsdata.config import DEFAULT_FILE_TYPE, DataConfig
from fmsdata.handlers import make_handler
from fmsdata.handlers.base import FileHandler

__all__ = ["handler_for"]


def handler_for(data: DataConfig, eos_token: int | None = None) -> FileHandler:
    """The handler of ``data.file_type`` with the section's format options.

    An unset ``file_type`` is the default one (``build_dataloader`` fills it from the
    root's ``metadata.json`` first, see ``fmsdata.data.rootconfig``). Flat token files split
    documents at ``doc_separator``, else at ``eos_token`` (the documents section's).
    """
    separator = data.doc_separator if data.doc_separator is not None else eos_token
    return make_handler(
        data.file_type if data.file_type is not None else DEFAULT_FILE_TYPE,
        col_name=data.col_name,
        text_field=data.text_field,
        tokenizer=data.tokenizer,
        token_dtype=data.token_dtype,
        separator=separator,
        strict=data.strict,
        cache_dir=data.cache_dir,
    )
