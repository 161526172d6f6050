"""Reward shaping: format score, DAPO's soft overlong penalty, the overlong filter, weighted sums."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .result import ERROR, NO_ANSWER, OK, TIMEOUT, Verifier, VerifyResult

# <think>...</think> then an answer tag or a \boxed{} (the R1-style format). As a regex this backtracks (cubic in
# repeated `</think>\boxed{`), so FormatReward checks it with _is_r1_format, which accepts exactly the same texts.
DEFAULT_FORMAT_PATTERN = r"^\s*<think>.*?</think>\s*(?:<answer>.*?</answer>|.*\\boxed\{.*\}.*)\s*$"
MAX_FORMAT_CHARS = 200_000  # longer completions fail the format check rather than run a regex over them

# Linear: each try after a </think> scans only the blanks that follow it, and those runs do not overlap.
_THINK_THEN_ANSWER = re.compile(r"</think>\s*<answer>")


def _is_r1_format(text: str) -> bool:
    """Whether DEFAULT_FORMAT_PATTERN matches `text` (re.DOTALL), in time linear in its length."""
    body = text.strip()  # the pattern's leading and trailing \s* (str.strip and \s agree on what is blank)
    if not body.startswith("<think>"):
        return False
    think_close = body.find("</think>", len("<think>"))
    if think_close < 0:
        return False
    # the \boxed{...} branch: the earliest \boxed{ after the first </think>, closed by any later }
    box = body.find("\\boxed{", think_close + len("</think>"))
    if box >= 0 and body.find("}", box + len("\\boxed{")) >= 0:
        return True
    # the <answer> branch: some </think>, blanks, <answer>, then anything, and </answer> ending the text
    if not body.endswith("</answer>"):
        return False
    answer = _THINK_THEN_ANSWER.search(body, think_close)
    return answer is not None and answer.end() <= len(body) - len("</answer>")


@dataclass(frozen=True)
class FormatReward:
    """`score` if the whole completion matches `pattern` (re.DOTALL), else 0.0. Picklable, so pools can run it."""

    pattern: str = DEFAULT_FORMAT_PATTERN  # default: R1-style <think> block then <answer> or \boxed{}
    score: float = 1.0  # reward for a well-formed completion (R1 uses 1.0)

    def __post_init__(self) -> None:
        compiled = None  # the default pattern is checked by _is_r1_format instead
        if self.pattern != DEFAULT_FORMAT_PATTERN:
            try:
                compiled = re.compile(self.pattern, re.DOTALL)
            except re.error as exc:
                raise ValueError(f"FormatReward.pattern is not a valid regular expression: {exc}") from exc
        object.__setattr__(self, "_compiled", compiled)

    def __call__(self, completion: str, *, answer: Any = None, **info: Any) -> VerifyResult:
        if not isinstance(completion, str) or len(completion) > MAX_FORMAT_CHARS:
            return VerifyResult(0.0, OK, {"matched": False})
        if self._compiled is None:
            matched = _is_r1_format(completion)
        else:
            matched = self._compiled.match(completion) is not None
        return VerifyResult(self.score if matched else 0.0, OK, {"matched": matched})

    def __reduce__(self):  # the compiled pattern is rebuilt, not pickled
        return (FormatReward, (self.pattern, self.score))

    @property
    def in_process_safe(self) -> bool:
        # The default check is linear; a user regex can backtrack for minutes, so score_batch runs it in the pool
        # under the hard limit.
        return self._compiled is None


def format_reward(pattern: str = DEFAULT_FORMAT_PATTERN, score: float = 1.0) -> FormatReward:
    """A verifier scoring the completion's shape; `pattern` is a regex over the whole completion."""
    return FormatReward(pattern, score)


def soft_overlong_penalty(length: int, max_length: int, cache_length: int) -> float:
    """DAPO's R_len (arXiv 2503.14476; docs/formulas.md#overlong-filtering-and-the-soft-overlong-penalty): 0 up to
    max_length - cache_length, then linear down to -1 at max_length, -1 beyond."""
    if max_length <= 0 or cache_length <= 0 or cache_length > max_length:
        raise ValueError(
            f"need 0 < cache_length <= max_length, got max_length={max_length}, cache_length={cache_length}"
        )
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    expected = max_length - cache_length
    if length <= expected:
        return 0.0
    if length <= max_length:
        return (expected - length) / cache_length
    return -1.0


def overlong_filter_mask(lengths: Sequence[int], max_length: int, truncated: Sequence[bool] | None = None) -> list[bool]:
    """DAPO overlong filtering: True = keep in the loss; a completion cut at the budget is masked out.

    A completion is overlong when `truncated` says so, or (without flags) when its length reaches max_length.
    """
    if max_length <= 0:
        raise ValueError(f"max_length must be > 0, got {max_length}")
    if truncated is not None:
        if len(truncated) != len(lengths):
            raise ValueError(f"truncated has {len(truncated)} flags for {len(lengths)} lengths")
        return [not bool(flag) for flag in truncated]
    return [int(length) < max_length for length in lengths]


_STATUS_PRIORITY = (ERROR, TIMEOUT, NO_ANSWER, OK)  # the combined status is the worst component status


class WeightedSum:
    """sum(weight * component score); details["components"] and ["statuses"] keep each component's own score and
    status, ["reasons"] the reason of each component that gave one (why it could not score)."""

    def __init__(self, components: Sequence[tuple[str, Verifier, float]]):
        checked = []
        for index, item in enumerate(components):
            if not (isinstance(item, tuple) and len(item) == 3):
                raise ValueError(f"WeightedSum component {index} must be (name, verifier, weight), got {item!r}")
            name, verifier, weight = item
            if not isinstance(name, str) or not callable(verifier) or not isinstance(weight, (int, float)):
                raise ValueError(f"WeightedSum component {index} ({name!r}) needs a str name, a callable and a number")
            checked.append((name, verifier, float(weight)))
        names = [name for name, _, _ in checked]
        if len(set(names)) != len(names):
            raise ValueError(f"WeightedSum component names must be unique, got {names}")
        if not checked:
            raise ValueError("WeightedSum needs at least one component")
        self.components = tuple(checked)
        # bounded in-process only if every part is (score_batch may then skip the worker pool)
        self.in_process_safe = all(getattr(v, "in_process_safe", False) for _, v, _ in checked)

    def __call__(self, completion: str, *, answer: Any = None, **info: Any) -> VerifyResult:
        total, scores, statuses, reasons = 0.0, {}, {}, {}
        for name, verifier, weight in self.components:
            result = verifier(completion, answer=answer, **info)
            if not isinstance(result, VerifyResult):  # the plain-float convenience form
                result = VerifyResult(float(result))
            total += weight * result.score
            scores[name], statuses[name] = result.score, result.status
            if "reason" in result.details:
                reasons[name] = result.details["reason"]
        status = next(s for s in _STATUS_PRIORITY if s in statuses.values())
        details = {"components": scores, "statuses": statuses}
        return VerifyResult(total, status, {**details, "reasons": reasons} if reasons else details)
