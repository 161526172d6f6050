"""A reward function of your own, named by its import path ("package.module:function"), as a verifier.

Two signatures are taken as they are written:

- this project's: ``function(completion, *, answer, **info)``;
- verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` (recognised by its
  ``solution_str`` parameter): ``data_source`` and ``extra_info`` come from ``info`` when given.

It may return a VerifyResult, a number (a bool counts as 0 or 1), or verl's dict with a ``"score"`` (its other keys
kept as details). Whatever it raises or returns otherwise is a result with status "error", never an exception: the
function reads model output. It carries only its path, so it pickles by reference into score_batch's worker
processes, where it runs under their time limit; the module must be importable there (an installed package, or
the working directory on PYTHONPATH).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .result import ERROR, OK, VerifyResult


@functools.cache
def import_function(spec: str) -> Callable:
    """The callable ``spec`` ("package.module:function", the function's name may be dotted) names, imported once per
    process; ValueError naming what is wrong otherwise."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"a reward function is named 'package.module:function', got {spec!r}")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"reward function {spec!r}: cannot import {module_name!r} ({error}); install it, or put "
                         f"its directory on PYTHONPATH") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"reward function {spec!r}: {module_name!r} has no {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"reward function {spec!r} is a {type(target).__name__}, not a function")
    return target


def is_verl_style(function: Callable) -> bool:
    """Whether ``function`` takes verl's compute_score arguments (it names a ``solution_str``)."""
    try:
        return "solution_str" in inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


def as_result(value: Any) -> VerifyResult:
    """A reward function's return value as a VerifyResult (status "error" when it is not a finite score)."""
    if isinstance(value, VerifyResult):
        return value
    details: dict[str, Any] = {}
    if isinstance(value, dict) and "score" in value:  # verl's {"score": ..., "acc": ..., ...}
        details = {key: item for key, item in value.items() if key != "score"}
        value = value["score"]
    if isinstance(value, (bool, int, float)) and math.isfinite(value):
        return VerifyResult(float(value), OK, details)
    return VerifyResult(0.0, ERROR, {"reason": f"the reward function returned {str(value)[:200]!r}, not a score"})


@dataclass(frozen=True)
class ImportedVerifier:
    """The reward function ``spec`` names, called as a verifier: ``(completion, *, answer, **info) -> VerifyResult``.
    Built only from an importable spec (ValueError otherwise)."""

    spec: str

    def __post_init__(self) -> None:
        if not isinstance(self.spec, str):
            raise ValueError(f"a reward function is named 'package.module:function', got {self.spec!r}")
        import_function(self.spec)

    def __call__(self, completion: str, *, answer: Any = None, **info: Any) -> VerifyResult:
        function = import_function(self.spec)
        try:
            if is_verl_style(function):
                value = function(data_source=info.get("data_source"), solution_str=completion, ground_truth=answer,
                                 extra_info=info.get("extra_info"))
            else:
                value = function(completion, answer=answer, **info)
        except Exception as error:  # the function reads model output: whatever it raises is this row's error
            return VerifyResult(0.0, ERROR, {"reason": f"{type(error).__name__}: {str(error)[:300]}"})
        return as_result(value)
