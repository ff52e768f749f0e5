"""The documentation's references follow the code: every config field and every CLI
command is in them, and they are exactly what ``python docs/gen_reference.py`` writes from
the config sections' docstrings and the parsers' ``--help`` (issue 43). Needs no docs
packages; the site build itself (``mkdocs build --strict``) runs in ``.ci/run``."""

import importlib.util
import os
import re

from fmsdata.cli.main import build_parser
from fmsdata.config import SECTIONS, LoaderConfig

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs")


def generator():
    spec = importlib.util.spec_from_file_location(
        "gen_reference", os.path.join(DOCS, "gen_reference.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read(*parts):
    with open(os.path.join(DOCS, *parts), encoding="utf-8") as handle:
        return handle.read()


def test_every_config_field_is_in_the_reference_under_its_section():
    page = read("reference", "config.md")
    found, section = {}, None
    for line in page.splitlines():
        heading = re.match(r"^## `(\w+)`$", line)
        if heading:
            section = heading.group(1)
        row = re.match(r"^\| `(\w+)` \|", line)
        if row and row.group(1) != "field":
            found[row.group(1)] = section
    expected = {name: s for s, cls in SECTIONS.items() for name in cls.__dataclass_fields__}
    assert set(found) == set(LoaderConfig.field_names())
    assert found == expected


def test_every_cli_command_is_in_the_reference_with_its_options():
    page = read("reference", "cli.md")
    gen = generator()
    lines = [line for line, _ in gen.commands(build_parser())]
    assert {"fmsdata", "fmsdata state show", "fmsdata verify", "fmsdata warm"} <= set(lines)
    for line, parser in gen.commands(build_parser()):
        start = page.index(f"## `{line}`\n")
        section = page[start : page.find("\n## ", start + 1)]
        for action in parser._actions:
            for option in action.option_strings:
                assert option in section, (line, option)


def test_references_are_what_the_generator_writes():
    for path, text in generator().pages().items():
        with open(path, encoding="utf-8") as handle:
            assert handle.read() == text, (
                f"{os.path.relpath(path)} is out of date: run python docs/gen_reference.py"
            )


def test_an_attribute_entry_may_document_several_fields():
    gen = generator()

    class Example:
        """Summary.

        Attributes:
            a, b: Shared
                text.
            c: Own.

        Raises:
            Nothing.
        """

    assert gen.attribute_docs(Example) == {"a": "Shared text.", "b": "Shared text.", "c": "Own."}


def test_the_readme_links_to_pages_that_exist():
    """The README is the front page on GitHub, where its links are read as paths."""
    root = os.path.join(DOCS, "..")
    with open(os.path.join(root, "README.md"), encoding="utf-8") as handle:
        links = re.findall(r"\]\(([^)#\s]+)(#[^)\s]*)?\)", handle.read())
    relative = [(path, anchor) for path, anchor in links if "://" not in path]
    assert len(relative) >= 10
    for path, anchor in relative:
        target = os.path.join(root, path)
        assert os.path.isfile(target), path
        if anchor:  # a heading of that page, as GitHub and the site's toc spell its id
            with open(target, encoding="utf-8") as handle:
                ids = {
                    re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
                    for line in handle
                    if line.startswith("#")
                }
            assert anchor[1:] in ids, (path, anchor)
