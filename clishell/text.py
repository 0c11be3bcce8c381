"""Untrusted text on a terminal: what must never reach it raw.

Values that come from outside (a model name a client sent, a licence from a model card, a
string in a bundle index) are printed by every CLI. C0 and C1 control characters (ESC
sequences, CR, LF, BEL) let such a value repaint the screen, set the window title or forge a
whole output line (``\\nOK bundle``); Unicode bidirectional marks and overrides reorder what is
shown. :data:`UNSAFE_TEXT` matches all of them; :func:`shown` prints a value escaped when it
holds one; :func:`escaped` escapes them one by one in a whole message that may carry such a
value (the last guard before a line reaches the terminal).
"""

from __future__ import annotations

import json
import re

__all__ = ["UNSAFE_TEXT", "counted", "escaped", "human_bytes", "shown"]

UNSAFE_TEXT = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""C0/C1 controls, DEL, and the Unicode bidirectional marks, embeddings, overrides, isolates."""


def shown(value: object) -> str:
    """``str(value)`` for a terminal: as is, or JSON-escaped (in quotes) if it holds a
    character of :data:`UNSAFE_TEXT`."""
    text = str(value)
    if UNSAFE_TEXT.search(text) is None:
        return text
    return json.dumps(text, ensure_ascii=False).translate(_ESCAPE_REST)


def escaped(text: str) -> str:
    """``text`` with each character of :data:`UNSAFE_TEXT` written as a Python escape
    (``\\x1b``, ``\\x0a``, ``\\u202e``); every other character as it is."""
    return UNSAFE_TEXT.sub(_escape_one, text)


def _escape_one(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


# json.dumps escapes C0 controls but leaves DEL, C1 and the bidi characters as they are.
_ESCAPE_REST = {c: f"\\u{c:04x}" for c in [0x7f, *range(0x80, 0xa0), 0x200e, 0x200f,
                                            *range(0x202a, 0x202f), *range(0x2066, 0x206a)]}


def human_bytes(size: int) -> str:
    """A byte count as an operator reads it: ``3.0 MiB (3,145,728 bytes)``, binary units.

    ``4 GiB - 1 byte`` style for one byte short of a whole unit (FAT32's largest file is
    4294967295 bytes: "4.0 GiB" would hide that it is not 4 GiB).
    """
    exact = f"{size:,} byte{'s' if size != 1 else ''}"
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale:
            if (size + 1) % scale == 0:
                return f"{(size + 1) // scale} {unit} - 1 byte ({exact})"
            return f"{size / scale:.1f} {unit} ({exact})"
    return exact


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """``n`` and the noun in the number it takes: ``1 container``, ``2 containers``.

    Args:
        n: How many.
        singular: The noun for one (``"default-deny policy"``).
        plural: The noun for other counts; ``singular + "s"`` when None.
    """
    return f"{n} {singular if n == 1 else (plural or singular + 's')}"
