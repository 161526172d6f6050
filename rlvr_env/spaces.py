"""Text spaces for prompts and completions."""

from __future__ import annotations

import multiprocessing as mp
import string
from types import ModuleType
from typing import Any

from gymnasium import spaces
from gymnasium.vector.utils import create_shared_memory

# What ``sample()`` draws from: printable ASCII plus Latin, Greek, punctuation and maths symbols.
_BLOCKS = [(0x00A0, 0x024F), (0x0370, 0x03FF), (0x2000, 0x22FF)]
SAMPLE_CHARSET = frozenset(string.printable) | frozenset(chr(c) for lo, hi in _BLOCKS for c in range(lo, hi + 1))


class UnicodeText(spaces.Text):
    """A Text space that holds any Unicode string within its length bounds.

    Prompts (box drawing, emoji in reasoning-gym puzzles) and model output can use
    any character, and a charset of all of Unicode would not fit in memory; so
    ``contains`` checks only the type and length, and ``sample`` draws from
    ``SAMPLE_CHARSET``.
    """

    def __init__(self, max_length: int, min_length: int = 0) -> None:
        super().__init__(max_length=max_length, min_length=min_length, charset=SAMPLE_CHARSET)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"


@create_shared_memory.register(UnicodeText)
def _refuse_shared_memory(space: UnicodeText, n: int = 1, ctx: ModuleType = mp):
    # AsyncVectorEnv reads a shared-memory Text space once, at construction, into a tuple of str (not
    # a view like an array's), so every later observation would be that first, empty read.
    raise ValueError(
        f"{space} observations cannot use AsyncVectorEnv's shared memory; pass "
        "vector_kwargs={'shared_memory': False} to gymnasium.make_vec (or shared_memory=False to AsyncVectorEnv)"
    )
