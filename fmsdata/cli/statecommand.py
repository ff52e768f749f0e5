"""``fmsdata state``: the command that groups the actions on saved loader states, ``show``
(``fmsdata.cli.state``) and ``diff`` (``fmsdata.cli.statediff``)."""

from __future__ import annotations

import argparse

from fmsdata.cli.state import add_show_parser
from fmsdata.cli.statediff import add_diff_parser

__all__ = ["add_parser"]


HELP = "inspect saved loader states"
DESCRIPTION = "Inspect saved loader states (fmsdata state show PATH, fmsdata state diff A B)."


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("state", help=HELP, description=DESCRIPTION)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    add_show_parser(actions)
    add_diff_parser(actions)
