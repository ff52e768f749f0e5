"""Read the plain parts of a ``torch.save`` file without running anything it names.

Trainers write their checkpoints with ``torch.save``: a Lightning ``.ckpt`` file, OLMo-core's
``step<N>/train/rank<r>.pt``. Such a file is a zip whose ``data.pkl`` is a pickle, and
``torch.load(weights_only=False)`` runs whatever that pickle names. ``weights_only=True``
runs nothing, but refuses a whole file for one value outside its allow-list (OLMo-core's
rank files hold numpy's random state, which it refuses), so it cannot reach the loader
state inside them.

Here the pickle is read by an unpickler that resolves no global: every class or function
the file names becomes an inert placeholder (``Opaque``: its name, and the arguments and
state the file gave it), which is never imported or called, and tensor storages are never
read (a persistent id becomes a placeholder too). Only three names build real values, from
plain arguments, by code of this module: ``_codecs.encode`` (how protocol 2 pickles
``bytes``: a latin-1 string), ``bytes()`` and ``collections.OrderedDict``. The extension
registry (``EXT`` opcodes) is refused. What comes back is the file's tree of dicts, lists,
strings, numbers and bytes, with placeholders where anything else was; a caller takes the
plain part it wants and checks its types.
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from typing import Any, BinaryIO

from fmsdata.errors import StateMismatchError

__all__ = ["Opaque", "is_torch_save", "read_torch_save"]

_PICKLE = "data.pkl"


class Opaque:
    """Something a pickle named and this reader did not build: its global's dotted name,
    and what the pickle passed to it (never called)."""

    global_name = "?"
    args: tuple[Any, ...]

    def __new__(cls, *args: Any, **kwargs: Any) -> Opaque:
        self = object.__new__(cls)
        self.args = args
        self.state = None
        return self

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<{self.global_name}, not read>"


def _latin1(text: Any = "", encoding: Any = "latin1") -> bytes:
    """``_codecs.encode(str, "latin1")``: how pickle protocol 2 writes a ``bytes``."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("_codecs.encode is read only for latin-1 byte strings")
    return text.encode("latin1")


def _empty_bytes(*args: Any) -> bytes:
    if args:
        raise pickle.UnpicklingError("bytes() is read only without arguments")
    return b""


_BUILDERS: dict[tuple[str, str], Any] = {
    ("_codecs", "encode"): _latin1,
    ("builtins", "bytes"): _empty_bytes,
    ("__builtin__", "bytes"): _empty_bytes,
    ("collections", "OrderedDict"): collections.OrderedDict,
}


def _refuse_extension(self: Any) -> None:
    raise pickle.UnpicklingError("the pickle uses the extension registry (EXT opcodes)")


class _InertUnpickler(pickle._Unpickler):  # the Python unpickler: its dispatch table is ours
    dispatch = dict(pickle._Unpickler.dispatch)
    for _code in (pickle.EXT1, pickle.EXT2, pickle.EXT4):
        dispatch[_code[0]] = _refuse_extension

    def __init__(self, file: Any):
        super().__init__(file)
        self._placeholders: dict[tuple[str, str], type[Opaque]] = {}

    def find_class(self, module: str, name: str) -> Any:
        built = _BUILDERS.get((module, name))
        if built is not None:
            return built
        key = (module, name)
        if key not in self._placeholders:
            dotted = f"{module}.{name}"
            self._placeholders[key] = type("Opaque", (Opaque,), {"global_name": dotted})
        return self._placeholders[key]

    def persistent_load(self, pid: Any) -> Any:
        return _Storage()


class _Storage(Opaque):
    global_name = "tensor storage"


def is_torch_save(stream: BinaryIO) -> bool:
    """Whether the seekable binary ``stream`` is a ``torch.save`` file (a zip holding
    ``<name>/data.pkl``); it is left at its start."""
    try:
        stream.seek(0)
        if stream.read(2) != b"PK":
            return False
        stream.seek(0)
        with zipfile.ZipFile(stream) as archive:
            return _pickle_member(archive) is not None
    except zipfile.BadZipFile:
        return False
    finally:
        stream.seek(0)


def _pickle_member(archive: zipfile.ZipFile) -> str | None:
    names = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith("/" + _PICKLE)]
    return names[0] if len(names) == 1 else None


def read_torch_save(stream: BinaryIO, where: str) -> Any:
    """The object tree of the ``torch.save`` file in the seekable binary ``stream``, with an
    ``Opaque`` placeholder for every class, function and tensor it holds (see the module
    docstring). Only the pickle is read, never the tensors' data.

    Raises:
        StateMismatchError: Not a ``torch.save`` zip (the legacy format of torch < 1.6
            included), or a malformed pickle; naming ``where``.
    """
    try:
        stream.seek(0)
        with zipfile.ZipFile(stream) as archive:
            member = _pickle_member(archive)
            if member is None:
                raise StateMismatchError(
                    f"{where}: a zip file, but not one torch.save writes (no <name>/data.pkl)"
                )
            pickled = archive.read(member)
    except zipfile.BadZipFile:
        raise StateMismatchError(
            f"{where}: not a torch.save file (not a zip archive; files saved by torch "
            "before 1.6, or with _use_new_zipfile_serialization=False, are not read)"
        ) from None
    try:
        return _InertUnpickler(io.BytesIO(pickled)).load()
    except Exception as err:  # a malformed stream fails in many ways inside the unpickler
        raise StateMismatchError(
            f"{where}: cannot read its pickle ({type(err).__name__}: {err}); nothing in it was run"
        ) from None
