"""Griffe extensions for the API reference (``mkdocs.yml`` names them)."""

from __future__ import annotations

import os
from typing import Any

import griffe


class HandlersAsSubpackage(griffe.Extension):
    """``fmsdata.handlers`` lives in the repository's top-level ``handlers/`` folder
    (``pyproject.toml`` maps it into the package), where griffe, reading ``fmsdata/`` from
    its files, does not look. When ``fmsdata`` is loaded, the folder is loaded too, into
    the same collection, and attached as ``fmsdata.handlers``, so its pages and
    cross-references name it as users import it."""

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


class CheckedDefaults(griffe.Extension):
    """Config section fields are declared ``checked(default, reader)``
    (``fmsdata.config.section``): their signatures show the default."""

    def on_attribute_instance(self, *, attr: Any, **kwargs: Any) -> None:
        value = attr.value
        if isinstance(value, griffe.ExprCall) and str(value.function) == "checked":
            attr.value = value.arguments[0]
