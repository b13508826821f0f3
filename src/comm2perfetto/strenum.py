"""``StrEnum``: Python 3.11's ``enum.StrEnum`` for 3.10, the base of every set of words the code compares and
writes out (call states, verdicts ...).

A member is a ``str``: it equals, hashes and serialises as its value (``"completed"``), so JSON, CSV and text
read as they did when these were plain strings, and a value read from a file compares equal to its member.

>>> class Colour(StrEnum):
...     RED = "red"
>>> Colour.RED == "red", f"{Colour.RED}", str(Colour.RED), "red" in {Colour.RED}, Colour("red") is Colour.RED
(True, 'red', 'red', True, True)
"""

from __future__ import annotations

from enum import Enum

__all__ = ["StrEnum"]


class StrEnum(str, Enum):
    """An enum whose members are their values as ``str``: ``str()`` and ``format()`` give the value, not
    ``Class.NAME`` (what a ``(str, Enum)`` gives from Python 3.12 on)."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)
