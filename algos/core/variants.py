"""Named variants of one kind of core function (advantage estimators, policy losses, ...).

A variant is one function and the line registering it; configs take their allowed values from the
registry, so adding one needs no other edit (docs/CONTRIBUTING.md walks through adding RLOO's advantage).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


class Registry(dict):
    """name -> function; ``registry[name]`` of an unknown name is a ValueError listing the known ones."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def register(self, name: str, function: F) -> F:
        """Add ``function`` under ``name`` (a second function under one name is an error); returns it.

        A call after the definition, not a decorator: mutmut, which `make mutation` runs, leaves decorated
        functions unmutated, and these are the formulas mutation testing must reach."""
        if name in self:
            held = getattr(self[name], "__qualname__", type(self[name]).__name__)
            raise ValueError(f"{self.kind} {name!r} is already registered ({held})")
        self[name] = function
        return function

    def __missing__(self, name: str):
        raise ValueError(f"unknown {self.kind} {name!r}: choose one of {', '.join(map(repr, self))}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self)
