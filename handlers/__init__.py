"""Shard-format handlers and the registry that picks one by ``file_type``.

Formats: ``arrow`` (one record batch per document, Bamba), ``hf_arrow`` (many rows per
batch, Hugging Face ``datasets``), ``parquet`` (token list or text column), ``megatron``
(``.bin``/``.idx``), ``pbin`` (Modalities), ``npy`` (flat token streams), ``cepe`` (CEPE's
counted ``.npy``), ``jsonl`` (text, plain/gz/zst), ``mds`` (MosaicML streaming), and
``auto``, which picks per file by ending (never ``cepe``: its ``.npy`` files look flat).
Users add a format by subclassing ``FileHandler`` and calling ``register_handler``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from fmsdata.errors import ConfigError, ShardFormatError
from fmsdata.handlers.arrow import ArrowDocHandler
from fmsdata.handlers.base import FileHandler, FlatBuffer, FlatBufferHandler, column_candidates
from fmsdata.handlers.cepe import CepeHandler
from fmsdata.handlers.flat import FlatTokensHandler
from fmsdata.handlers.hf_arrow import HFArrowHandler
from fmsdata.handlers.jsonl import JsonlHandler
from fmsdata.handlers.mapping import MappedFile
from fmsdata.handlers.mds import MdsHandler
from fmsdata.handlers.megatron import MegatronHandler
from fmsdata.handlers.parquet import ParquetHandler
from fmsdata.handlers.pbin import PbinHandler

__all__ = [
    "FileHandler",
    "FlatBuffer",
    "FlatBufferHandler",
    "ArrowDocHandler",
    "HFArrowHandler",
    "ParquetHandler",
    "MegatronHandler",
    "PbinHandler",
    "FlatTokensHandler",
    "CepeHandler",
    "JsonlHandler",
    "MdsHandler",
    "AutoHandler",
    "MappedFile",
    "register_handler",
    "make_handler",
    "handler_class",
    "handler_names",
]

_REGISTRY: dict[str, type[FileHandler]] = {}


def register_handler(cls: type[FileHandler], name: str | None = None) -> type[FileHandler]:
    """Make ``cls`` selectable as ``file_type=name`` (default ``cls.name``); also a decorator."""
    key = name or cls.name
    if not key:
        raise ConfigError(f"handler {cls.__name__} has no name; set the class attribute 'name'")
    _REGISTRY[key] = cls
    return cls


def handler_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def handler_class(file_type: str) -> type[FileHandler]:
    """The class registered as ``file_type``.

    Raises:
        ConfigError: No handler has that name.
    """
    try:
        return _REGISTRY[file_type]
    except KeyError:
        raise ConfigError(
            f"file_type {file_type!r} is not a known format; known: {', '.join(handler_names())}"
        ) from None


def make_handler(file_type: str, **options: Any) -> FileHandler:
    """Instantiate the handler registered as ``file_type`` with the options it accepts.

    Options a handler's constructor does not take are ignored, so one config can carry
    the options of several formats.
    """
    cls = handler_class(file_type)
    if cls.__init__ is object.__init__:
        return cls()
    params = inspect.signature(cls.__init__).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    accepted = {k: v for k, v in options.items() if (takes_all or k in params) and v is not None}
    return cls(**accepted)


class _AutoReader:
    def __init__(self, handler: FileHandler, reader: Any):
        self.handler = handler
        self.reader = reader


class AutoHandler(FileHandler):
    """Picks the format of each file by its ending (``.arrow`` by its token column's type).

    Args:
        options: Format options passed on to the handlers it picks (``col_name``,
            ``tokenizer``, ``token_dtype``, ``separator``, ...).
    """

    name = "auto"
    # Order matters where files pair up: a .bin beside an .idx is Megatron's, not flat.
    _ORDER = ("megatron", "mds", "pbin", "jsonl", "parquet", "arrow", "npy")

    def __init__(self, **options: Any):
        self.options = {k: v for k, v in options.items() if v is not None}
        self._handlers: dict[str, FileHandler] = {}

    @classmethod
    def is_legal(cls, path: str) -> bool:
        return any(_REGISTRY[name].is_legal(path) for name in cls._ORDER)

    def _handler(self, name: str) -> FileHandler:
        if name not in self._handlers:
            self._handlers[name] = make_handler(name, **self.options)
        return self._handlers[name]

    def _format_of(self, path: str) -> str:
        for name in self._ORDER:
            if path.endswith(_REGISTRY[name].extensions):
                if name == "arrow":
                    return self._arrow_kind(path)
                return name
        raise ShardFormatError(f"{path}: no format reads files ending like this")

    def count_metadata(
        self, read: Callable[[str, int, int], bytes], path: str, size: int, tokens: bool
    ) -> tuple[int, int] | None:
        """Counted by the handler of the file's ending, where the ending alone tells it (an
        ``.arrow`` file may be of either Arrow layout: only its reader tells, so it is not)."""
        for name in ("megatron", "pbin", "mds"):
            if path.endswith(_REGISTRY[name].extensions):
                return self._handler(name).count_metadata(read, path, size, tokens)
        return None

    def _arrow_kind(self, path: str) -> str:
        wanted = column_candidates(self.options.get("col_name", "tokens"))
        try:
            with pa.memory_map(path) as source:
                head = source.read(6)
                source.seek(0)
                schema = (pa.ipc.open_file if head == b"ARROW1" else pa.ipc.open_stream)(
                    source
                ).schema
                names = schema.names
        except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
            raise ShardFormatError(f"{path}: not a readable Arrow file ({err})") from None
        col = next((name for name in wanted if name in names), None)
        kind = schema.field(col).type if col is not None else None
        return (
            "hf_arrow"
            if kind is not None and (pa.types.is_list(kind) or pa.types.is_large_list(kind))
            else "arrow"
        )

    @classmethod
    def select(cls, paths: list[str]) -> list[str]:
        chosen: list[str] = []
        claimed: set[str] = set()
        for name in cls._ORDER:
            handler = _REGISTRY[name]
            for path in handler.select([p for p in paths if p not in claimed]):
                chosen.append(path)
                claimed.add(path)
                claimed.update(handler.companions(path))
        return sorted(chosen)

    @classmethod
    def companions(cls, path: str) -> list[str]:
        for name in cls._ORDER:
            if _REGISTRY[name].is_legal(path):
                return _REGISTRY[name].companions(path)
        return []

    def open(self, path: str) -> _AutoReader:
        handler = self._handler(self._format_of(path))
        return _AutoReader(handler, handler.open(path))

    def num_docs(self, reader: _AutoReader) -> int:
        return reader.handler.num_docs(reader.reader)

    def get(self, reader: _AutoReader, index: int) -> Any:
        return reader.handler.get(reader.reader, index)

    def slice(self, doc: Any, start: int, n: int) -> Any:
        return doc[start : start + n]

    def doc_lengths(self, reader: _AutoReader, indices: Any) -> Any:
        return reader.handler.doc_lengths(reader.reader, indices)

    def doc_edges(self, reader: _AutoReader, indices: Any) -> Any:
        return reader.handler.doc_edges(reader.reader, indices)

    def reader_format(self, reader: _AutoReader) -> type[FileHandler]:
        return reader.handler.reader_format(reader.reader)

    def token_buffer(self, reader: _AutoReader) -> Any:
        return reader.handler.token_buffer(reader.reader)

    def release(self, reader: _AutoReader) -> None:
        reader.handler.release(reader.reader)

    def close(self, reader: _AutoReader) -> None:
        reader.handler.close(reader.reader)

    def describe(self) -> dict[str, Any]:
        return {
            "file_type": self.name,
            **{k: v for k, v in self.options.items() if k != "cache_dir"},
        }


for _cls in (
    ArrowDocHandler,
    HFArrowHandler,
    ParquetHandler,
    MegatronHandler,
    PbinHandler,
    FlatTokensHandler,
    CepeHandler,
    JsonlHandler,
    MdsHandler,
):
    register_handler(_cls)
_REGISTRY["auto"] = AutoHandler
