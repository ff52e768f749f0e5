"""The command line's argument parser: every option's default is shown in ``--help``."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["ArgumentParser", "HelpFormatter", "int_at_least", "positive_int", "non_negative_int"]


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
