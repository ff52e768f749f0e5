"""The loader configuration: one frozen dataclass, loadable from a dict, YAML or CLI overrides.

Field names follow the fms-fsdp / Bamba training config (``data_path``, ``datasets``,
``weights``, ``col_name``, ``bos_token`` ...), so an existing config file loads unchanged;
``datasets``, ``weights`` and ``strip_tokens`` also accept that config's comma strings.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import yaml

from fmsdata.errors import ConfigError
from fmsdata.textcorpus import TOKENIZER_HINT
from fmsdata.urls import local_path, location

__all__ = [
    "LoaderConfig",
    "PATH_FIELDS",
    "BATCH_FORMATS",
    "DEFAULT_FILE_TYPE",
    "PACKING_MODES",
    "as_config",
    "as_plain",
    "parse_overrides",
]

# The format of a root whose metadata.json does not say (fms-fsdp's default).
DEFAULT_FILE_TYPE = "arrow"

PACKING_MODES = ("hard", "pad")
DOCUMENT_ORDERS = ("random", "sequential")
BATCH_FORMATS = ("dict", "tuple")
OUTPUT_DTYPES = ("int64", "int32")


def _split_csv(field: str, value: Any) -> tuple[str, ...] | None:
    """Accept ``"a,b"``, ``["a", "b"]`` or None; return a tuple of stripped strings."""
    if value is None:
        return None
    if isinstance(value, str):
        items = [item.strip() for item in value.split(",")]
        return tuple(item for item in items if item)
    if isinstance(value, (list, tuple)):
        return tuple(str(item).strip() for item in value)
    raise ConfigError(f"{field} must be a comma string or a list, got {value!r}")


_KIND_NAMES = {int: "an integer", float: "a number"}


def _to_number(field: str, value: Any, kind: type) -> Any:
    expected = _KIND_NAMES.get(kind, f"a {kind.__name__}")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{field} must be {expected}, got {value!r}")
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{field} must be {expected}, got {value!r}") from None
    if kind is int and isinstance(value, float) and value != number:
        raise ConfigError(f"{field} must be an integer, got {value!r}")
    return number


_SPECIAL_TOKENS = ("bos_token", "eos_token", "bol_token", "eol_token", "pad_token")


def _optional_token(field: str, value: Any) -> int | None:
    if value is None:
        return None
    token = _to_number(field, value, int)
    if token < 0:
        raise ConfigError(f"{field} must be a non-negative token id or None, got {value!r}")
    return token


# Every field that holds a path, and where it may be (``fmsdata.urls``): "read" and
# "write", a local path or a URL of any fsspec filesystem (read from, or written to);
# "local", a path on this machine (a URL is refused by name, never made a local folder).
PATH_FIELDS = {
    "data_path": "read",
    "checkpoint_dir": "write",
    "tokenizer": "local",
    "cache_dir": "local",
}
_LOCAL_HINTS = {
    "tokenizer": TOKENIZER_HINT,
    "cache_dir": "it holds local copies of remote files; give a local folder",
}


def _optional_path(field: str, value: Any) -> str | None:
    """A path field (``PATH_FIELDS``): None, or a non-empty ``str`` / ``os.PathLike`` (as
    ``str``) that is a URL only where the field may be one."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise ConfigError(f"{field} must be a path (a non-empty string) or None, got {value!r}")
    text = str(os.fspath(value))
    kind = PATH_FIELDS[field]
    if kind == "local":
        return local_path(text, field, _LOCAL_HINTS.get(field, ""))
    return location(text, field, write=kind == "write")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """Everything that decides which tokens the loader emits and how it runs.

    Attributes:
        data_path: Data root (local path or fsspec URL) holding one folder per dataset.
        datasets: Dataset folder names; None means every folder of the root except ``meta``.
        weights: Token share of each dataset (non-negative, any scale); None means equal.
        weight_schedule: Weights that change over the run: ``[[at, [w, ...]], ...]`` with
            ``at`` in ``schedule_unit``; replaces ``weights``.
        schedule_unit: ``"tokens"`` (global document tokens) or ``"steps"`` (needs
            ``global_batch_size``; with ``packing="hard"`` a point at step ``S`` takes
            effect in the batch of step ``S``, counted from 0).
        schedule_interpolation: ``"step"`` (each point holds until the next) or
            ``"linear"`` (moves between points in ``schedule_resolution`` steps).
        schedule_resolution: Cells of the grid a ``"linear"`` schedule moves on between two
            points (its weights change at each cell's start).
        global_batch_size: Sequences per global step, for step-based schedules and skips.
        allow_mix_change: Accept a resumed state saved with other ``datasets`` / weights /
            schedule: each dataset continues from its own position, new ones start.
        skip_steps: ``[[step, n], ...]``: when the run reaches ``step``, pass over the next
            ``n`` batches (applied once; the state records it).
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
        endpoint_url: S3-compatible endpoint of ``s3://`` roots (default: the AWS
            environment, e.g. ``AWS_ENDPOINT_URL``, else AWS itself).
        aws_profile: AWS profile of ``s3://`` roots (default: ``AWS_PROFILE`` / default).
        anonymous: Unsigned requests to ``s3://`` roots (public buckets).
        storage_options: Extra fsspec filesystem options for the root (any backend). May
            hold credentials: they are never logged nor saved in a loader state.
        remote_cache_gb: Size the local cache of a remote root's files is trimmed to
            (files being read always stay).
        remote_retries: Tries of a remote read before ``RemoteIOError``.
        remote_backoff: Seconds before the first retry (doubling, capped at 30 s).
        seq_length: Tokens per training sequence; packed lines hold ``seq_length + 1``.
        batch_size: Sequences per batch on this rank.
        bos_token, eos_token: Added at the start / end of every document when set; a
            document that already starts / ends with that token (``pbin``, ``npy``, or as
            the root's ``metadata.json`` records) keeps just one. Elsewhere a file most of
            whose sampled documents already carry it is refused (``fmsdata.delimiters``):
            list it in ``strip_tokens``, or unset the field. Unset ``eos_token`` is
            the EOS the root's ``metadata.json`` records; a set one must agree with it,
            as must a set ``bos_token`` with the tokenizer's BOS recorded there.
        bol_token, eol_token: Added at the start / end of every packed line when set.
        strip_tokens: Token ids removed when found as the first or last token of a document
            (for data that already carries its own BOS/EOS).
        packing: ``"hard"`` splits documents to fill every line; ``"pad"`` starts a new
            line rather than splitting and fills the rest with ``pad_token``.
        pad_token: Padding token id (required by ``packing="pad"``).
        min_length: Documents with fewer tokens (after stripping) are skipped and counted.
        logical_shards: Number of independent streams the data is split into; every world
            size the run may use must be at most this (and divide it for exact rescaling).
            The default, 8 like ``batch_size``, keeps global steps exact on 1 to 8 ranks;
            for more, set a multiple of every world size you will use.
        shuffle_window: Lines held in the shuffle buffer of each logical shard (0 or 1 = off;
            not used with ``document_order: sequential``).
        document_order: ``"random"`` (a keyed walk per epoch, lines shuffled) or
            ``"sequential"`` (files in order, documents in stored order, no shuffle buffer:
            continuous packing).
        seed: Seed of every random order (file walk, document walk, shuffle).
        num_workers: DataLoader worker processes per rank.
        prefetch_factor: Items (a few dozen batches of its rows) each worker prepares
            ahead; the workers' shared batch ring holds prefetch_factor + 2 items.
        pin_memory: Pin batch tensors (for asynchronous host-to-device copies).
        multiprocessing_context: ``"fork"``, ``"spawn"``, ``"forkserver"`` or None (default).
        vocab_size: When set, a token id at or above it is an error naming the file.
            Unset: the tokenizer's size the root's ``metadata.json`` records; a set one
            must not be smaller (larger is a model's padded vocabulary).
        return_position_ids: Add ``position_ids`` restarting at each document.
        return_cu_seqlens: Add ``cu_seqlens`` and ``max_seqlen`` for varlen attention.
        return_document_ids: Add ``document_ids``: per input token, the id of its source
            document (``dataset << 56 | file << 32 | doc``, -1 on padding; see
            ``fmsdata.stages.outputs``), for document masks.
        fim_training: Fill-in-the-middle on every line (``fmsdata.stages.fim``), with
            fms-fsdp's field names: each document piece of at least ``fim_min_length``
            tokens becomes PSM with probability ``psm_rate`` or SPM with ``spm_rate``.
        psm_rate, spm_rate: Probabilities (summing to at most 1) of the two FIM layouts.
        fim_pre, fim_mid, fim_suf: FIM sentinel token ids; None inserts no token there.
        fim_min_length: Document pieces shorter than this stay as they are.
        batch_format: ``"dict"`` (named tensors) or ``"tuple"``: the same tensors in the
            batch's key order, ``(input_ids, labels, ...)`` (a preprocess's keys sorted),
            for loops written ``for input, label in loader``; a batch of one tensor is
            that tensor.
        output_dtype: ``"int64"`` or ``"int32"``: the dtype the workers write the per-token
            outputs in (fms-fsdp's batches are int32; ``document_ids`` need int64).
        ignore_first_labels: Labels at the start of every line set to -100, ignored by the
            loss (fms-fsdp's ``causal_lm`` ignores the first).
        open_files: Shard files each worker keeps open at most (least recently used closed);
            None sizes it from the streams the worker runs.
        checkpoint_dir: Folder of automatic loader checkpoints (``step_NNNNNNNNN/``), a
            local path or any fsspec URL (``s3://bucket/run/loader``, reached with the
            storage options below); when set, the loader resumes from the newest complete
            one it finds there.
        checkpoint_every: Save a loader checkpoint every this many batches (0 = never).
        checkpoint_keep: Automatic checkpoints kept (older ones are removed).
    """

    data_path: str
    datasets: tuple[str, ...] | None = None
    weights: tuple[float, ...] | None = None
    weight_schedule: tuple[tuple[int, tuple[float, ...]], ...] | None = None
    schedule_unit: str = "tokens"
    schedule_interpolation: str = "step"
    schedule_resolution: int = 100
    global_batch_size: int | None = None
    allow_mix_change: bool = False
    skip_steps: tuple[tuple[int, int], ...] = ()
    file_type: str | None = None
    col_name: str = "tokens"
    text_field: str = "text"
    tokenizer: str | None = None
    token_dtype: str | None = None
    doc_separator: int | None = None
    strict: bool = False
    cache_dir: str | None = None
    endpoint_url: str | None = None
    aws_profile: str | None = None
    anonymous: bool = False
    storage_options: Mapping[str, Any] | None = dataclasses.field(default=None, repr=False)
    remote_cache_gb: float = 100.0
    remote_retries: int = 8
    remote_backoff: float = 0.5
    seq_length: int = 4096
    batch_size: int = 8
    bos_token: int | None = None
    eos_token: int | None = None
    bol_token: int | None = None
    eol_token: int | None = None
    strip_tokens: tuple[int, ...] = ()
    packing: str = "hard"
    pad_token: int | None = None
    min_length: int = 1
    # As batch_size: a global batch of any world size that can run (up to 8 ranks) is then
    # a multiple of it, so the defaults keep G2/G3 exact; more ranks need more shards.
    logical_shards: int = 8
    shuffle_window: int = 160
    document_order: str = "random"
    seed: int = 42
    num_workers: int = 1
    prefetch_factor: int = 2
    pin_memory: bool = False
    multiprocessing_context: str | None = None
    vocab_size: int | None = None
    return_position_ids: bool = False
    return_cu_seqlens: bool = False
    return_document_ids: bool = False
    fim_training: bool = False
    psm_rate: float = 0.0
    spm_rate: float = 0.0
    fim_pre: int | None = None
    fim_mid: int | None = None
    fim_suf: int | None = None
    fim_min_length: int = 2
    batch_format: str = "dict"
    output_dtype: str = "int64"
    ignore_first_labels: int = 0
    open_files: int | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    checkpoint_keep: int = 2

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if not isinstance(self.data_path, (str, os.PathLike)) or not str(self.data_path):
            raise ConfigError(f"data_path must be a non-empty path or URL, got {self.data_path!r}")
        set_(self, "data_path", _optional_path("data_path", self.data_path))

        datasets = _split_csv("datasets", self.datasets)
        if datasets is not None:
            if not datasets or any(not name for name in datasets):
                raise ConfigError(f"datasets must name at least one folder, got {self.datasets!r}")
            if len(set(datasets)) != len(datasets):
                raise ConfigError(f"datasets lists a folder twice: {self.datasets!r}")
        set_(self, "datasets", datasets)

        weights = _split_csv("weights", self.weights)
        if weights is not None:
            set_(self, "weights", _weight_list("weights", weights, datasets))
        self._check_schedule(datasets)
        skips = []
        for item in self.skip_steps or ():
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise ConfigError(f"skip_steps entries are [step, n], got {item!r}")
            at, n = (_to_number("skip_steps", v, int) for v in item)
            if at < 0 or n < 1:
                raise ConfigError(f"skip_steps needs step >= 0 and n >= 1, got {list(item)!r}")
            skips.append((at, n))
        set_(self, "skip_steps", tuple(skips))

        strip = _split_csv("strip_tokens", self.strip_tokens) or ()
        set_(self, "strip_tokens", tuple(_optional_token("strip_tokens", t) for t in strip))

        for name in ("bos_token", "eos_token", "bol_token", "eol_token", "pad_token"):
            set_(self, name, _optional_token(name, getattr(self, name)))
        self._check_fim()
        positive = ("seq_length", "batch_size", "logical_shards", "prefetch_factor")
        for name in positive:
            value = _to_number(name, getattr(self, name), int)
            if value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
            set_(self, name, value)
        for name in (
            "min_length",
            "shuffle_window",
            "num_workers",
            "seed",
            "checkpoint_every",
            "checkpoint_keep",
        ):
            value = _to_number(name, getattr(self, name), int)
            if value < 0:
                raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
            set_(self, name, value)
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ConfigError(
                f"checkpoint_every={self.checkpoint_every} needs checkpoint_dir, got None"
            )
        if self.open_files is not None:
            files = _to_number("open_files", self.open_files, int)
            if files < 1:
                raise ConfigError(
                    f"open_files must be a positive integer or None, got {self.open_files!r}"
                )
            set_(self, "open_files", files)
        if self.vocab_size is not None:
            vocab = _to_number("vocab_size", self.vocab_size, int)
            if vocab < 1:
                raise ConfigError(f"vocab_size must be positive or None, got {self.vocab_size!r}")
            set_(self, "vocab_size", vocab)
            for name in (*_SPECIAL_TOKENS, "fim_pre", "fim_mid", "fim_suf"):
                token = getattr(self, name)
                if token is not None and token >= vocab:
                    raise ConfigError(f"{name}={token} is outside vocab_size={vocab}")

        if self.document_order not in DOCUMENT_ORDERS:
            raise ConfigError(
                f"document_order must be one of {DOCUMENT_ORDERS}, got {self.document_order!r}"
            )
        if self.packing not in PACKING_MODES:
            raise ConfigError(f"packing must be one of {PACKING_MODES}, got {self.packing!r}")
        if self.packing == "pad" and self.pad_token is None:
            raise ConfigError("packing='pad' needs pad_token, got pad_token=None")
        if self.content_capacity < 1:
            raise ConfigError(
                f"seq_length={self.seq_length} leaves no room for document tokens "
                "between bol_token and eol_token"
            )
        if self.multiprocessing_context not in (None, "fork", "spawn", "forkserver"):
            raise ConfigError(
                "multiprocessing_context must be fork, spawn, forkserver or None, "
                f"got {self.multiprocessing_context!r}"
            )
        if self.batch_format not in BATCH_FORMATS:
            raise ConfigError(
                f"batch_format must be one of {BATCH_FORMATS}, got {self.batch_format!r}"
            )
        if self.output_dtype not in OUTPUT_DTYPES:
            raise ConfigError(
                f"output_dtype must be one of {OUTPUT_DTYPES}, got {self.output_dtype!r}"
            )
        if self.output_dtype == "int32" and self.return_document_ids:
            raise ConfigError(
                "return_document_ids needs output_dtype='int64' (an id is "
                "dataset << 56 | file << 32 | doc), got output_dtype='int32'"
            )
        first = self.ignore_first_labels
        if (
            not isinstance(first, int)
            or isinstance(first, bool)
            or not 0 <= first <= self.seq_length
        ):
            raise ConfigError(
                f"ignore_first_labels must be an integer from 0 to seq_length "
                f"({self.seq_length}), got {first!r}"
            )
        columns = _split_csv("col_name", self.col_name)
        if not columns or not all(columns):
            raise ConfigError(
                f"col_name must name a column or a comma list of them, got {self.col_name!r}"
            )
        set_(self, "col_name", ",".join(columns))
        if self.file_type is not None and (
            not isinstance(self.file_type, str) or not self.file_type
        ):
            raise ConfigError(f"file_type must be a format name or unset, got {self.file_type!r}")
        if self.token_dtype is not None:
            try:
                dtype = np.dtype(self.token_dtype)
            except TypeError:
                raise ConfigError(
                    f"token_dtype must be a numpy integer type, got {self.token_dtype!r}"
                ) from None
            if dtype.kind not in "iu":
                raise ConfigError(f"token_dtype must be an integer type, got {self.token_dtype!r}")
            set_(self, "token_dtype", dtype.name)
        set_(self, "doc_separator", _optional_token("doc_separator", self.doc_separator))
        for name in PATH_FIELDS:
            if name != "data_path":  # checked first, above
                set_(self, name, _optional_path(name, getattr(self, name)))
        if not isinstance(self.text_field, str) or not self.text_field:
            raise ConfigError(f"text_field must be a non-empty name, got {self.text_field!r}")
        self._check_remote()
        for name in (
            "pin_memory",
            "return_position_ids",
            "return_cu_seqlens",
            "return_document_ids",
            "fim_training",
            "allow_mix_change",
            "strict",
            "anonymous",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")

    def _check_fim(self) -> None:
        set_ = object.__setattr__
        for name in ("fim_pre", "fim_mid", "fim_suf"):
            set_(self, name, _optional_token(name, getattr(self, name)))
        for name in ("psm_rate", "spm_rate"):
            rate = _to_number(name, getattr(self, name), float)
            if not 0.0 <= rate <= 1.0:
                raise ConfigError(f"{name} must be a probability in [0, 1], got {rate!r}")
            set_(self, name, rate)
        if self.psm_rate + self.spm_rate > 1.0:
            raise ConfigError(
                f"psm_rate + spm_rate must be at most 1, got {self.psm_rate} + {self.spm_rate}"
            )
        least = _to_number("fim_min_length", self.fim_min_length, int)
        if least < 0:
            raise ConfigError(f"fim_min_length must be a non-negative integer, got {least!r}")
        set_(self, "fim_min_length", least)

    def _check_remote(self) -> None:
        for name in ("endpoint_url", "aws_profile"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{name} must be a non-empty string or None, got {value!r}")
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            # The value itself may hold secrets: name its type only.
            raise ConfigError(
                "storage_options must be a mapping of fsspec options, "
                f"got a {type(self.storage_options).__name__}"
            )
        size = _to_number("remote_cache_gb", self.remote_cache_gb, float)
        if not size > 0:
            raise ConfigError(f"remote_cache_gb must be positive, got {self.remote_cache_gb!r}")
        object.__setattr__(self, "remote_cache_gb", size)
        tries = _to_number("remote_retries", self.remote_retries, int)
        if tries < 1:
            raise ConfigError(f"remote_retries must be at least 1, got {self.remote_retries!r}")
        object.__setattr__(self, "remote_retries", tries)
        backoff = _to_number("remote_backoff", self.remote_backoff, float)
        if not 0 <= backoff < 3600:
            raise ConfigError(f"remote_backoff must be in [0, 3600) s, got {self.remote_backoff!r}")
        object.__setattr__(self, "remote_backoff", backoff)

    def _check_schedule(self, datasets: tuple[str, ...] | None) -> None:
        if self.schedule_unit not in ("tokens", "steps"):
            raise ConfigError(
                f"schedule_unit must be 'tokens' or 'steps', got {self.schedule_unit!r}"
            )
        if self.schedule_interpolation not in ("step", "linear"):
            raise ConfigError(
                "schedule_interpolation must be 'step' or 'linear', "
                f"got {self.schedule_interpolation!r}"
            )
        if self.global_batch_size is not None:
            size = _to_number("global_batch_size", self.global_batch_size, int)
            if size < 1:
                raise ConfigError(
                    f"global_batch_size must be positive, got {self.global_batch_size!r}"
                )
            object.__setattr__(self, "global_batch_size", size)
        resolution = _to_number("schedule_resolution", self.schedule_resolution, int)
        if resolution < 1:
            raise ConfigError(
                f"schedule_resolution must be positive, got {self.schedule_resolution!r}"
            )
        object.__setattr__(self, "schedule_resolution", resolution)
        if self.weight_schedule is None:
            return
        if self.weights is not None:
            raise ConfigError("set weights or weight_schedule, not both")
        if not isinstance(self.weight_schedule, (list, tuple)) or not self.weight_schedule:
            raise ConfigError(
                f"weight_schedule must be a list of [at, weights], got {self.weight_schedule!r}"
            )
        points = []
        for point in self.weight_schedule:
            if not isinstance(point, (list, tuple)) or len(point) != 2:
                raise ConfigError(f"weight_schedule points are [at, weights], got {point!r}")
            at = _to_number("weight_schedule", point[0], int)
            if at < 0:
                raise ConfigError(
                    f"weight_schedule position must be non-negative, got {point[0]!r}"
                )
            points.append(
                (
                    at,
                    _weight_list(
                        "weight_schedule", _split_csv("weight_schedule", point[1]) or (), datasets
                    ),
                )
            )
        if any(b[0] <= a[0] for a, b in zip(points, points[1:])):
            raise ConfigError(
                f"weight_schedule positions must increase, got {[p[0] for p in points]}"
            )
        if self.schedule_unit == "steps" and self.global_batch_size is None:
            raise ConfigError(
                "schedule_unit='steps' needs global_batch_size (sequences per global step)"
            )
        object.__setattr__(self, "weight_schedule", tuple(points))

    @property
    def line_length(self) -> int:
        """Tokens in one packed line: one more than ``seq_length`` for the causal shift."""
        return self.seq_length + 1

    @property
    def content_capacity(self) -> int:
        """Document tokens that fit in one line after the line delimiters."""
        return self.line_length - (self.bol_token is not None) - (self.eol_token is not None)

    # -- construction -------------------------------------------------------------------

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> LoaderConfig:
        """Build from a mapping; unknown keys are an error naming them."""
        if not isinstance(values, Mapping):
            raise ConfigError(f"a loader config must be a mapping, got {type(values).__name__}")
        _refuse_unknown(values, cls.field_names())
        if "data_path" not in values:
            raise ConfigError("config field data_path is required")
        return cls(**dict(values))

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], overrides: Iterable[str] = ()) -> LoaderConfig:
        """Read a YAML file (optionally under a top-level ``data:`` key) and apply overrides.

        Raises:
            ConfigError: Unreadable, not YAML, not a mapping of fields, or ``path`` is a
                URL (config files are read from this machine).
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
        if isinstance(values, Mapping) and set(values) == {"data"}:
            values = values["data"]
        if not isinstance(values, Mapping):
            kind = "list" if isinstance(values, list) else type(values).__name__
            shown = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
            raise ConfigError(
                f"config file {where!r} holds {shown} at its top level, but a loader config is a "
                "mapping of field: value; write one field per line without a leading '- ', "
                "e.g. 'data_path: /data/root' and 'seq_length: 4096'"
            )
        return cls.from_dict({**values, **parse_overrides(overrides)})

    def replace(self, **changes: Any) -> LoaderConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def with_overrides(self, overrides: Iterable[str]) -> LoaderConfig:
        """A copy with ``key=value`` overrides applied (values parsed as YAML scalars)."""
        parsed = parse_overrides(overrides)
        _refuse_unknown(parsed, self.field_names(), " in overrides")
        return self.replace(**parsed)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, not tuples) suitable for YAML or JSON."""
        return {k: as_plain(v) for k, v in dataclasses.asdict(self).items()}


def _refuse_unknown(values: Mapping[str, Any], known: Sequence[str], where: str = "") -> None:
    """A ``ConfigError`` naming each unknown key of ``values`` and the field it is closest to."""
    unknown = sorted(set(values) - set(known), key=str)
    if not unknown:
        return
    described = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
        described.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    raise ConfigError(
        f"unknown config field(s){where}: {', '.join(described)}; known fields: {', '.join(known)}"
    )


def as_plain(value: Any) -> Any:
    """``value`` with every tuple made a list and every mapping a dict, nested, as it
    comes back from JSON: how config values and saved state fields are compared."""
    if isinstance(value, (list, tuple)):
        return [as_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: as_plain(v) for k, v in value.items()}
    return value


def _weight_list(
    field: str, values: Sequence[Any], datasets: tuple[str, ...] | None
) -> tuple[float, ...]:
    numbers = tuple(_to_number(field, w, float) for w in values)
    if any(not (0 <= w < float("inf")) for w in numbers) or not any(w > 0 for w in numbers):
        raise ConfigError(
            f"{field} must be non-negative and finite with one positive, got {list(values)!r}"
        )
    if datasets is None:
        raise ConfigError(f"{field} needs datasets: name the folders the weights belong to")
    if len(numbers) != len(datasets):
        raise ConfigError(
            f"{field} has {len(numbers)} entries but datasets has {len(datasets)}: "
            f"{list(values)!r} for {list(datasets)!r}"
        )
    return numbers


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


def as_config(config: LoaderConfig | Mapping[str, Any] | str | os.PathLike[str]) -> LoaderConfig:
    """Accept a config object, a dict or a YAML path."""
    if isinstance(config, LoaderConfig):
        return config
    if isinstance(config, Mapping):
        return LoaderConfig.from_dict(config)
    if isinstance(config, (str, os.PathLike)):
        return LoaderConfig.from_yaml(config)
    raise ConfigError(f"cannot build a loader config from {type(config).__name__}")
