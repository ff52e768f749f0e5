"""What a config section is: a frozen dataclass whose fields each name the reader
(``fmsdata.config.values``) that checks and normalizes the value given."""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from fmsdata.config.values import Reader, set_field

__all__ = ["Section", "checked"]

T = TypeVar("T")


def checked(default: T, read: Reader, *, repr: bool = True) -> T:
    """A section field with its default, read by ``read`` when the section is built."""
    return dataclasses.field(default=default, repr=repr, metadata={"read": read})


class Section:
    """A config section: its ``checked`` fields read in declaration order, then ``_check``."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            read = field.metadata.get("read")
            if read is not None:
                set_field(self, field.name, read(field.name, getattr(self, field.name)))
        self._check()

    def _check(self) -> None:
        """What spans fields of the section (each field was read on its own)."""
