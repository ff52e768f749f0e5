"""``get_dataset``: fixed-length token windows over any root fmsdata reads, map-style.

Item ``i`` is window ``i`` of the root's token stream (every document of every file, in
file order, EOS-separated; see ``files``): ``token_ids`` (``context_length`` tokens),
``document_ids`` (a document number per token, from 0 in each window) and, on request,
``document_mask``. Windows tile the stream: window ``i`` starts at token
``i * (context_length - overlap)``; ``overlap=1`` makes consecutive windows share one
token, so ``input = w[:-1]``, ``label = w[1:]`` trains on every transition of the stream.
The object pickles small (file list and offsets; nothing open), opens files lazily in
each process, and reads windows of flat-buffer formats as memory-map slices, so it works
with ``DistributedSampler`` and with fork or spawn DataLoader workers.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from fmsdata.data.indexing import CACHE_LIMIT
from fmsdata.errors import ConfigError
from fmsdata.handlers import make_handler
from fmsdata.handlers.derived import default_cache_dir
from fmsdata.mapstyle.files import StreamFiles, list_stream_files
from fmsdata.mapstyle.source import RootSpec, resolve_root
from fmsdata.mapstyle.windows import StreamReader
from fmsdata.remote.cache import file_source
from fmsdata.remote.storage import Storage
from fmsdata.util.permute import derive_key, permute
from fmsdata.util.urls import local_path

__all__ = ["TokenWindowDataset", "get_dataset", "SPLITS"]

SPLITS = (None, "train", "val")
_SPLIT_ALIASES = {"validation": "val", "valid": "val", "all": None, "full": None}


class TokenWindowDataset(Dataset):
    """Map-style windows of a root's token stream (build it with ``get_dataset``).

    Attributes:
        context_length: Tokens per window.
        overlap: Tokens consecutive windows share.
        vocab_size: From the root's metadata (None when it records none).
        eos_token: The token separating documents.
        tokenizer_file: The tokenizer bundled with the root, if any.
        split: The split items come from (None: every window).
    """

    def __init__(
        self,
        spec: RootSpec,
        files: StreamFiles,
        *,
        context_length: int,
        overlap: int,
        drop_last: bool,
        pad_token_id: int,
        eos_token: int,
        create_doc_ids: bool,
        create_doc_mask: bool,
        dense_mask: bool,
        token_output_format: str,
        storage: Storage,
        cache_dir: str,
        vocab_size: int | None,
    ):
        self.spec, self.files = spec, files
        self.context_length, self.overlap = context_length, overlap
        self.stride = context_length - overlap
        self.drop_last, self.pad_token_id, self.eos_token = drop_last, pad_token_id, eos_token
        self.create_doc_ids = create_doc_ids or create_doc_mask
        self.create_doc_mask, self.dense_mask = create_doc_mask, dense_mask
        self.token_output_format = token_output_format
        self.storage, self.cache_dir = storage, cache_dir
        self.vocab_size = vocab_size if vocab_size is not None else spec.vocab_size
        self.tokenizer_file = spec.tokenizer_file
        total = files.num_tokens
        if total < context_length:
            full = 0
        else:
            full = (total - context_length) // self.stride + 1
        partial = not drop_last and (full == 0 or (full - 1) * self.stride + context_length < total)
        self._windows = full + int(partial and total > 0)
        self._val: tuple[int, int | None] | None = None  # (val windows, seed)
        self.split: str | None = None
        self._reader: StreamReader | None = None

    # -- sizes -------------------------------------------------------------------------------
    def __len__(self) -> int:
        if self.split is None or self._val is None:
            return self._windows
        k = self._val[0]
        return k if self.split == "val" else self._windows - k

    def num_tokens(self) -> int:
        """Tokens in the stream (documents and the EOS between them)."""
        return self.files.num_tokens

    def num_files(self) -> int:
        return len(self.files.paths)

    # -- splits ------------------------------------------------------------------------------
    def create_split(self, val_size: float | int, seed: int | None = None) -> None:
        """Hold out ``val_size`` windows (a fraction in (0, 1), or a count) for validation.

        Without ``seed`` the last windows are held out (as tatm does: ``val[0]`` is window
        ``len(train)``); with one, a keyed permutation of the windows picks them, and both
        splits list their windows in that permuted order. Deterministic for a given
        (root, context_length, val_size, seed); the current split is kept.
        """
        if isinstance(val_size, bool) or not isinstance(val_size, (int, float, np.integer)):
            raise ConfigError(f"val_size must be a fraction or a count, got {val_size!r}")
        if isinstance(val_size, float):
            if not 0.0 <= val_size < 1.0:
                raise ConfigError(f"val_size as a fraction must be in [0, 1), got {val_size!r}")
            count = int(round(self._windows * val_size))
        else:
            count = int(val_size)
        if not 0 <= count <= self._windows:
            raise ConfigError(
                f"val_size {val_size!r} asks for {count} windows; the dataset has {self._windows}"
            )
        self._val = (count, None if seed is None else int(seed))

    def set_split(self, name: str | None) -> None:
        """Serve ``"train"``, ``"val"`` or every window (``None``)."""
        name = _SPLIT_ALIASES.get(name, name) if isinstance(name, str) else name
        if name not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {name!r}")
        if name is not None and self._val is None:
            raise ConfigError(f"set_split({name!r}) needs a split: call create_split first")
        self.split = name

    def window_index(self, i: int) -> int:
        """The window of the whole stream that item ``i`` of the current split is."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {n} items")
        i = i + n if i < 0 else i
        if self.split is None or self._val is None:
            return i
        k, seed = self._val
        position = i if self.split == "val" else k + i
        if seed is None:
            return self._windows - k + i if self.split == "val" else i
        key = derive_key("fmsdata.get_dataset split", seed)
        return int(permute(np.array([position]), self._windows, key)[0])

    # -- items -------------------------------------------------------------------------------
    def _stream(self) -> StreamReader:
        if self._reader is None or self._reader.pid != os.getpid():
            opts = self.spec.options
            handler = make_handler(
                self.spec.file_type, cache_dir=self.cache_dir, separator=self.eos_token, **opts
            )
            source = file_source(
                self.spec.root,
                self.storage,
                os.path.join(self.cache_dir, "remote"),  # the loader's: one fetch for both
                CACHE_LIMIT,
                handler.companions,
            )
            flat = (
                make_handler("npy", cache_dir=self.cache_dir, separator=self.eos_token, **opts)
                if self.files.direct.any()
                else None
            )
            self._reader = StreamReader(self.files, handler, source, self.eos_token, flat)
        return self._reader

    def __getitem__(self, i: int) -> dict[str, Any]:
        start = self.window_index(int(i)) * self.stride
        stop = min(start + self.context_length, self.files.num_tokens)
        tokens, ids = self._stream().read(start, stop, np.dtype(np.int64), self.create_doc_ids)
        pad = self.context_length - len(tokens)
        if pad:
            tokens = np.concatenate([tokens, np.full(pad, self.pad_token_id, np.int64)])
            if ids is not None:  # padding is a document of its own
                nxt = int(ids[-1]) + 1 if len(ids) else 0
                ids = np.concatenate([ids, np.full(pad, nxt, np.int64)])
        item: dict[str, Any] = {"token_ids": tokens}
        if self.create_doc_ids:
            item["document_ids"] = ids
        if self.create_doc_mask:
            assert ids is not None  # read with create_doc_ids, which a mask implies
            item["document_mask"] = document_mask(ids, dense=self.dense_mask)
        if self.token_output_format == "torch":
            return {k: torch.from_numpy(v) for k, v in item.items()}
        return item

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_reader": None}

    def close(self) -> None:
        """Close the files this process opened (they reopen on the next item)."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __repr__(self) -> str:
        return (
            f"TokenWindowDataset({self.spec.root!r}, context_length={self.context_length}, "
            f"windows={self._windows}, split={self.split!r}, files={self.num_files()}, "
            f"tokens={self.num_tokens()})"
        )


def document_mask(ids: np.ndarray, dense: bool = False) -> np.ndarray:
    """The causal same-document attention mask of a window with document ids ``ids``.

    Compact (default): for each query token, the window position its document starts at;
    query ``q`` may attend to key ``k`` iff ``mask[q] <= k <= q``. Linear in the window
    length, and exactly the dense mask's information (documents are contiguous).
    Dense: the ``[L, L]`` boolean matrix itself (quadratic memory).
    """
    if not dense:
        return np.searchsorted(ids, ids, "left").astype(np.int64)
    same = ids[:, None] == ids[None, :]
    return np.logical_and(same, np.tri(len(ids), dtype=bool))


def get_dataset(
    metadata: str | os.PathLike,
    context_length: int,
    *,
    datasets: list[str] | None = None,
    overlap: int = 0,
    chunked: bool = True,
    drop_last: bool = True,
    pad_token_id: int = 0,
    eos_token: int | None = None,
    documents_end_with_eos: bool | None = None,
    create_doc_ids: bool = True,
    create_doc_mask: bool = False,
    dense_mask: bool = False,
    token_output_format: str = "torch",
    val_split_size: float | int | None = None,
    split: str | None = None,
    split_seed: int | None = None,
    vocab_size: int | None = None,
    file_type: str | None = None,
    col_name: str | None = None,
    token_dtype: str | None = None,
    dtype: str | None = None,
    cache_dir: str | None = None,
    storage: Storage | None = None,
) -> TokenWindowDataset:
    """A map-style ``Dataset`` of ``context_length``-token windows of a data root.

    Argument names follow tatm's ``get_dataset`` / ``TatmMemmapDataset`` where they mean
    the same, so tatm users and OLMo's ``custom_dataset`` configs pass them unchanged.

    Args:
        metadata: A name under ``$FMSDATA_DATA_DIR``, a ``metadata.json`` (or tatm
            ``metadata.yaml``) path, or a data root folder; local or any fsspec URL.
        context_length: Tokens per window.
        datasets: Dataset folders of the root to read (default: all, in name order).
        overlap: Tokens consecutive windows share (0: windows tile the stream; 1: every
            next-token transition falls inside some window).
        chunked: tatm's switch; False means a window at every token (overlap
            ``context_length - 1``).
        drop_last: Drop a last window shorter than ``context_length`` (else pad it with
            ``pad_token_id``; the padding is a document of its own).
        eos_token: The token between documents (default: the metadata's EOS; a different
            one is refused, as are ``file_type`` and a ``vocab_size`` smaller than the
            metadata's: see ``fmsdata.data.metadata.agree``).
        documents_end_with_eos: Whether the stored documents already end with
            ``eos_token`` (Megatron data written with ``--append-eod``, Arrow or Parquet
            another tool wrote with its EOS). None (default): as the root's
            ``metadata.json`` records (a different value given is refused), else as the
            format does: flat token files, ``.pbin`` and tatm roots store it; Arrow,
            Parquet, Megatron, MDS, JSONL, ... do not, so an EOS is added after every
            document, and a file most of whose sampled documents already end with it is
            refused (a ``ConfigError`` naming the file, when the dataset is built or
            before a window of that file is read) rather than read with each EOS twice.
            True: the stored one ends each document; none is added. False: one is added
            after every document, unchecked.
        create_doc_ids: Return ``document_ids``.
        create_doc_mask: Return ``document_mask`` (compact ``[L]`` form unless
            ``dense_mask``; see ``document_mask``).
        dense_mask: Return the mask as the dense ``[L, L]`` boolean matrix.
        token_output_format: ``"torch"`` (int64 tensors) or ``"numpy"`` (int64 arrays).
        val_split_size: With ``split``: ``create_split(val_split_size, split_seed)``
            then ``set_split(split)``.
        split: ``"train"``, ``"val"`` or None (see ``val_split_size``).
        split_seed: The seed of ``create_split`` (None: the last windows are held out).
        vocab_size: Default: the metadata's (a larger one is a padded model vocabulary).
        file_type: The shard format, where the metadata does not say.
        col_name: The token column, where the metadata does not say.
        token_dtype: The token type, where the metadata does not say (``dtype`` is tatm's
            name for it).
        cache_dir: Where one-time indexes go (default ``$FMSDATA_CACHE``).
        storage: Access options of remote roots.

    Raises:
        ConfigError: Bad arguments, unknown name or dataset, no EOS known, documents
            that already end with the EOS it would add (see ``documents_end_with_eos``).
        ShardFormatError: A file that is not what its format says.
    """
    if isinstance(context_length, bool) or not isinstance(context_length, int):
        raise ConfigError(f"context_length must be an int, got {context_length!r}")
    if context_length < 1:
        raise ConfigError(f"context_length must be positive, got {context_length}")
    if not chunked:
        overlap = context_length - 1
    if not 0 <= overlap < context_length:
        raise ConfigError(f"overlap must be in [0, context_length), got {overlap!r}")
    if token_output_format not in ("torch", "numpy", "np"):
        raise ConfigError(
            f"token_output_format must be 'torch' or 'numpy', got {token_output_format!r}"
        )
    if documents_end_with_eos not in (None, True, False):
        raise ConfigError(
            f"documents_end_with_eos must be True, False or None, got {documents_end_with_eos!r}"
        )
    storage = storage or Storage()
    cache_dir = local_path(cache_dir, "cache_dir") if cache_dir else default_cache_dir()
    spec = resolve_root(
        metadata,
        storage,
        datasets=datasets,
        file_type=file_type,
        eos_token=eos_token,
        vocab_size=vocab_size,
        options={"col_name": col_name, "token_dtype": token_dtype or dtype},
        documents_end_with_eos=documents_end_with_eos,
    )
    if spec.eos_token is None:
        raise ConfigError(
            f"{spec.root}: no end-of-document token known (its metadata names none): pass eos_token"
        )
    handler = make_handler(
        spec.file_type, cache_dir=cache_dir, separator=spec.eos_token, **spec.options
    )
    remote = os.path.join(cache_dir, "remote")  # its trim must see only fetched files
    source = file_source(spec.root, storage, remote, CACHE_LIMIT, handler.companions)
    try:
        files = list_stream_files(spec, handler, storage, source, cache_dir)
    finally:
        source.close()
    dataset = TokenWindowDataset(
        spec,
        files,
        context_length=context_length,
        overlap=overlap,
        drop_last=drop_last,
        pad_token_id=pad_token_id,
        eos_token=spec.eos_token,
        create_doc_ids=create_doc_ids,
        create_doc_mask=create_doc_mask,
        dense_mask=dense_mask,
        token_output_format="numpy" if token_output_format == "np" else token_output_format,
        storage=storage,
        cache_dir=cache_dir,
        vocab_size=spec.vocab_size,
    )
    if val_split_size is not None:
        dataset.create_split(val_split_size, split_seed)
    if split is not None:
        dataset.set_split(split)
    return dataset
