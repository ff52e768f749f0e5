"""Optional packages: which ``fmsdata[...]`` extra installs each, and the error saying so.

fmsdata's core needs only torch, numpy, pyarrow, fsspec, PyYAML and tokenizers. Object
storage, compressed text, Ray and plots need more; a feature that lacks its package ends
in a ``MissingDependencyError`` that names the feature, the package and the command that
installs it, instead of a traceback from deep inside fsspec or an import statement.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from fmsdata.errors import MissingDependencyError

__all__ = ["EXTRAS", "PROTOCOL_PACKAGES", "install_hint", "missing", "require"]

# Package (as imported) -> the fmsdata extra that installs it.
EXTRAS = {
    "s3fs": "s3",
    "gcsfs": "gcs",
    "zstandard": "text",
    "ray": "ray",
    "matplotlib": "plot",
    "torchtitan": "torchtitan",
    "olmo_core": "olmo-core",
    "pytorch_lightning": "lightning",
}

# fsspec protocols whose implementation an fmsdata extra installs.
PROTOCOL_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs"}


def install_hint(package: str) -> str:
    """The command that installs ``package``: its fmsdata extra, else the package itself."""
    extra = EXTRAS.get(package)
    return f'pip install "fmsdata[{extra}]"' if extra else f"pip install {package}"


def missing(
    package: str, purpose: str, cause: BaseException | None = None
) -> MissingDependencyError:
    """The error for ``purpose`` (e.g. ``"reading s3:// URLs"``) lacking ``package``.

    A package that is installed but fails to import (a broken or incompatible install)
    is told apart from one that is absent, with the import error's own words.
    """
    fix = install_hint(package)
    try:
        present = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        present = False
    if present:
        return MissingDependencyError(
            f"{purpose} needs the {package} package, which is installed but fails to import "
            f"({type(cause).__name__ if cause else 'ImportError'}: {cause}); "
            f"reinstall it with: {fix}"
        )
    return MissingDependencyError(
        f"{purpose} needs the {package} package, which is not installed; install it with: {fix}"
    )


def require(package: str, purpose: str) -> ModuleType:
    """Import ``package`` for ``purpose``, or raise ``missing(package, purpose)``."""
    try:
        return importlib.import_module(package)
    except ImportError as err:
        raise missing(package, purpose, err) from None
