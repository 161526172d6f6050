"""Text spaces for prompts and completions."""

from __future__ import annotations

import string

from gymnasium import spaces

# Printable ASCII plus the Unicode blocks prompts and completions use (Latin,
# Greek, punctuation, currency, letter-like symbols, arrows, maths operators).
_BLOCKS = [(0x00A0, 0x024F), (0x0370, 0x03FF), (0x2000, 0x22FF)]
CHARSET = frozenset(string.printable) | frozenset(chr(c) for lo, hi in _BLOCKS for c in range(lo, hi + 1))


def text_space(max_length: int, min_length: int = 0) -> spaces.Text:
    return spaces.Text(max_length=max_length, min_length=min_length, charset=CHARSET)


def outside_charset(text: str) -> set[str]:
    """Characters of ``text`` that a text space cannot hold."""
    return set(text) - CHARSET
