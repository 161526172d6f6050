"""A reward function of your own, named by its import path ("package.module:function"), as a verifier.

Three signatures are taken as they are written:

- this project's: ``function(completion, *, answer, **info)``;
- verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` (recognised by its
  ``solution_str`` parameter): ``data_source`` and ``extra_info`` come from ``info`` when given;
- TRL's batched reward function ``reward_func(completions, **kwargs) -> list`` (recognised by its ``completions``
  parameter), called as GRPOTrainer calls it, on a batch of one: ``completions``, ``prompts`` (``info``'s
  ``"prompt"``, when given) and every other column by name as one-item lists, the answer under ``answer_column``.
  Completions are chat messages (``[{"role": "assistant", "content": ...}]``) when the prompt is chat turns, text
  otherwise: TRL's rule. An async one is run to completion.

It may return a VerifyResult, a number (a bool counts as 0 or 1), or verl's dict with a ``"score"`` (its other keys
kept as details); a TRL function, a list of one of those (its None, TRL's "does not apply", is an error here).
Whatever it raises or returns otherwise is a result with status "error", never an exception: the function reads
model output. It carries only its path, so it pickles by reference into score_batch's worker processes, where it
runs under their time limit; the module must be importable there (an installed package, or the working directory
on PYTHONPATH). ``kwargs`` are passed to it on every call, as verl's ``custom_reward_function.reward_kwargs`` are
(a TRL function gets them as they are, not as columns).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import importlib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
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


def convention(function: Callable) -> str:
    """How ``function`` is called: "verl" (it names a ``solution_str``: verl's compute_score), "trl" (it names
    ``completions``: TRL's batched reward function), else "rlvr" (this project's verifier signature)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return "rlvr"
    return "verl" if "solution_str" in parameters else "trl" if "completions" in parameters else "rlvr"


# The arguments each convention's call sets itself, which keyword arguments of one's own may not name.
OWN_ARGUMENTS = {"rlvr": {"completion", "answer"}, "verl": {"data_source", "solution_str", "ground_truth", "extra_info"},
                 "trl": {"completions", "prompts"}}


def trl_batch(function: Callable, completion: str, answer: Any, answer_column: str, info: dict[str, Any]) -> dict:
    """GRPOTrainer's keyword arguments for one row: [completion], [prompt] (``info["prompt"]``) and each column as a
    one-item list; the completion as chat messages when the prompt is chat turns. Only the names ``function`` takes,
    unless it takes ``**kwargs``."""
    info = dict(info)
    prompt = info.pop("prompt", None)
    conversational = isinstance(prompt, (list, tuple))
    batch = {"completions": [[{"role": "assistant", "content": completion}] if conversational else completion],
             **{name: [value] for name, value in {**info, answer_column: answer}.items()}}
    if prompt is not None:
        batch["prompts"] = [list(prompt) if conversational else prompt]
    parameters = inspect.signature(function).parameters
    if any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters.values()):
        return batch
    return {name: value for name, value in batch.items() if name in parameters}


def run_to_completion(awaitable: Any) -> Any:
    """``awaitable``'s result, from synchronous code: in a thread of its own when this one runs an event loop (a
    notebook's, an async server's), where asyncio.run refuses to start a second."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop here
        return asyncio.run(awaitable)
    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, awaitable).result()


def call_trl(function: Callable, batch: dict) -> Any:
    """The one reward a TRL reward function gives a batch of one row (awaited when it is async)."""
    rewards = function(**batch)
    if inspect.isawaitable(rewards):
        rewards = run_to_completion(rewards)
    if isinstance(rewards, (list, tuple)) and len(rewards) == 1:
        if rewards[0] is None:
            raise ValueError("it returned [None], TRL's 'does not apply to this row': a reward here scores every row")
        return rewards[0]
    raise ValueError(f"it returned {str(rewards)[:200]}, not a list of one reward for the one completion")


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
    Built only from an importable spec (ValueError otherwise). ``answer_column``: the column a TRL reward function
    reads the answer from (the dataset's answer field's name: TRL's ``solution`` in its own examples)."""

    spec: str
    answer_column: str = "answer"
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed on every call (verl's reward_kwargs)

    def __post_init__(self) -> None:
        if not isinstance(self.spec, str):
            raise ValueError(f"a reward function is named 'package.module:function', got {self.spec!r}")
        import_function(self.spec)
        if not isinstance(self.kwargs, dict) or not all(isinstance(name, str) for name in self.kwargs):
            raise ValueError(f"reward function {self.spec!r}: its keyword arguments are a mapping of names to values, "
                             f"got {self.kwargs!r}")
        own = OWN_ARGUMENTS[self.convention] | ({self.answer_column} if self.convention == "trl" else set())
        if taken := sorted(own & set(self.kwargs)):
            raise ValueError(f"reward function {self.spec!r}: keyword argument {taken[0]!r} is one the call sets itself")

    @property
    def convention(self) -> str:
        """"rlvr", "verl" or "trl": how the function is called (``convention``)."""
        return convention(import_function(self.spec))

    def __call__(self, completion: str, *, answer: Any = None, **info: Any) -> VerifyResult:
        function = import_function(self.spec)
        style = convention(function)
        try:
            if style == "verl":
                value = function(data_source=info.get("data_source"), solution_str=completion, ground_truth=answer,
                                 extra_info=info.get("extra_info"), **self.kwargs)
            elif style == "trl":
                value = call_trl(function, {**trl_batch(function, completion, answer, self.answer_column, info),
                                            **self.kwargs})
            else:
                value = function(completion, answer=answer, **{**info, **self.kwargs})
        except Exception as error:  # the function reads model output: whatever it raises is this row's error
            reason = f"{type(error).__name__}: {str(error)[:300]}"
            text_completions = not isinstance(info.get("prompt"), (list, tuple))
            if style == "trl" and text_completions and isinstance(error, (TypeError, IndexError)):  # text read as messages
                reason += " (completions were text, as TRL passes them for a text prompt; chat-turn prompts get messages)"
            return VerifyResult(0.0, ERROR, {"reason": reason})
        return as_result(value)
