"""Real English text available on every Python install: the standard library's docstrings.

Used by the demo, the tests and the tokenizer fixture, so nothing is ever downloaded.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import sysconfig
import warnings
from collections.abc import Iterator
from importlib import resources

__all__ = [
    "stdlib_docstrings",
    "bundled_tokenizer_path",
    "resolve_tokenizer",
    "TOKENIZER_HINT",
    "BUNDLED_TOKENIZERS",
]

# Modules whose import has side effects or is slow; everything else in the stdlib is read.
_SKIP = {
    "antigravity",
    "this",
    "idlelib",
    "tkinter",
    "turtle",
    "turtledemo",
    "lib2to3",
    "test",
    "ensurepip",
}


def _in_stdlib(name: str) -> bool:
    """Whether the module ``name`` would be imported from the standard library: a file of
    the same name in the working folder (first on ``sys.path`` under ``python -m``) is
    never run for its docstrings."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    if spec.origin in (None, "built-in", "frozen"):
        return True
    roots = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib")}
    origin = os.path.realpath(spec.origin)
    return any(origin.startswith(os.path.realpath(root) + os.sep) for root in roots)


def stdlib_docstrings(min_chars: int = 200, limit: int | None = None) -> Iterator[str]:
    """Docstrings of standard-library modules, classes and functions (deduplicated)."""
    names = sorted(set(sys.stdlib_module_names) - _SKIP)
    seen: set[str] = set()
    count = 0
    for name in names:
        if name.startswith("_"):
            continue
        if not _in_stdlib(name):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                module = importlib.import_module(name)
            except Exception:  # noqa: BLE001 - platform modules may be missing
                continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated members (typing.io) warn on access
            found = list(_docstrings(module))
        for text in found:
            text = inspect.cleandoc(text)
            if len(text) < min_chars or text in seen:
                continue
            seen.add(text)
            yield text
            count += 1
            if limit is not None and count >= limit:
                return


def _docstrings(module: object) -> Iterator[str]:
    doc = getattr(module, "__doc__", None)
    if isinstance(doc, str):
        yield doc
    for _, member in sorted(vars(module).items()):
        if getattr(member, "__module__", None) != getattr(module, "__name__", None):
            continue
        doc = getattr(member, "__doc__", None)
        if isinstance(doc, str):
            yield doc
        if inspect.isclass(member):
            for _, attr in sorted(vars(member).items()):
                doc = getattr(attr, "__doc__", None)
                if inspect.isfunction(attr) and isinstance(doc, str):
                    yield doc


# Tokenizers shipped in fmsdata/data/, usable by name wherever a tokenizer is asked for.
BUNDLED_TOKENIZERS = ("stdlib-bpe-4k",)
# What to do with a tokenizer URL: tokenizers are read from this machine.
TOKENIZER_HINT = (
    "download the tokenizer.json first (fmsdata download URL DIR) and give the local file"
)


def bundled_tokenizer_path(name: str = "stdlib-bpe-4k") -> str:
    """A tokenizer shipped with fmsdata; ``stdlib-bpe-4k`` is a 4096-token BPE trained on
    ``stdlib_docstrings`` (ids 0, 1, 2 are ``<|bos|>``, ``<|eos|>``, ``<|pad|>``)."""
    return str(resources.files("fmsdata") / "data" / f"{name}.json")


def resolve_tokenizer(value: str) -> str:
    """A ``--tokenizer`` / ``tokenizer:`` value as a file path: an existing path as it is,
    the name of a bundled tokenizer (``stdlib-bpe-4k``, with or without ``.json``) as the
    installed file; anything else unchanged (the caller reports it missing)."""
    value = os.fspath(value)
    if os.path.exists(value):
        return value
    name = value[: -len(".json")] if value.endswith(".json") else value
    return bundled_tokenizer_path(name) if name in BUNDLED_TOKENIZERS else value
