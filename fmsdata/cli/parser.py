"""The command line's argument parser: every option's default is shown in ``--help``."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from fmsdata.errors import ConfigError
from fmsdata.util.urls import local_path, location

__all__ = [
    "ArgumentParser",
    "add_command",
    "int_list",
    "HelpFormatter",
    "PathArg",
    "int_at_least",
    "positive_int",
    "non_negative_int",
]


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help when it has a default worth saying.

    Unlike ``argparse.ArgumentDefaultsHelpFormatter`` it leaves out ``None``, ``False`` and
    empty defaults (flags, options that are off unless given), which say nothing.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or default == []
            or not (action.option_strings or action.nargs in ("?", "*"))
        ):
            return text
        return f"{text} (default: %(default)s)"


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with ``HelpFormatter``, also for its subcommands."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def int_at_least(low: int, why: str = "") -> Callable[[str], int]:
    """An argparse ``type``: an integer of at least ``low``; ``why`` explains the bound."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            reason = f" ({why})" if why else ""
            raise argparse.ArgumentTypeError(f"must be at least {low}{reason}, got {value}")
        return value

    parse.__name__ = f"int >= {low}"
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def int_list(text: str) -> list[int]:
    """An argparse ``type``: comma-separated non-negative integers (``0,1,2``)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(
            f"not comma-separated integers >= 0: {text!r} (e.g. 0,1,2)"
        )
    return values


def add_command(
    commands: argparse._SubParsersAction,
    name: str,
    run: Callable[[argparse.Namespace], int],
    summary: str,
    description: str,
) -> argparse.ArgumentParser:
    """Add the (sub)command ``name`` that calls ``run(args)``; ``summary`` is its line in
    the list of commands, ``description`` heads its ``--help``."""
    parser = commands.add_parser(name, help=summary, description=description)
    parser.set_defaults(run=run)
    return parser


class PathArg:
    """An argparse ``type`` for a path argument, checked by ``fmsdata.util.urls``: ``"local"``, a
    path on this machine (a URL is refused by name, never made a local folder called
    ``s3:``; ``file://`` is its path); ``"read"`` or ``"write"``, a local path or a URL of
    any fsspec filesystem (an unknown protocol is refused; ``"write"`` refuses read-only
    ones). Every path argument of the command line has one (a test checks it)."""

    def __init__(self, kind: str, hint: str = ""):
        if kind not in ("local", "read", "write"):
            raise ValueError(f"PathArg kind must be local, read or write, got {kind!r}")
        self.kind = kind
        self.hint = hint
        self.__name__ = "local path" if kind == "local" else "path or URL"

    def __call__(self, text: str) -> str:
        try:
            if self.kind == "local":
                return local_path(text, None, self.hint)
            return location(text, None, write=self.kind == "write")
        except ConfigError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
