"""A griffe extension for the API reference: ``fmsdata.handlers`` lives in the repository's
top-level ``handlers/`` folder (``pyproject.toml`` maps it into the package), where griffe,
reading ``fmsdata/`` from its files, does not look. When ``fmsdata`` is loaded, the folder
is loaded too, into the same collection, and attached as ``fmsdata.handlers``, so its
pages and cross-references name it as users import it."""

from __future__ import annotations

import os
from typing import Any

import griffe


class HandlersAsSubpackage(griffe.Extension):
    def on_package(self, *, pkg: Any, loader: Any, **kwargs: Any) -> None:
        if pkg.name != "fmsdata" or "handlers" in pkg.members:
            return
        root = os.path.dirname(os.path.dirname(str(pkg.filepath)))
        sub = griffe.GriffeLoader(
            search_paths=[root],
            modules_collection=loader.modules_collection,
            lines_collection=loader.lines_collection,
            docstring_parser=loader.docstring_parser,
            docstring_options=loader.docstring_options,
        )
        handlers = sub.load("handlers")
        del loader.modules_collection.members["handlers"]
        pkg.set_member("handlers", handlers)
