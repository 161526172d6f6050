"""Answer rewards shared by the numeric/maths tasks (Arithmetic, GSM8K, MATH).

Equivalence and extraction come from :mod:`rewards`; this module only adds the
task-side policy: a lenient last-number fallback (small base models rarely
write ``\\boxed{}``) and a small, separately reported credit for using it.
AnswerTask gives the tasks whose answer is one number (Arithmetic, GSM8K) their verifier and their chat turns.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import rewards
from rewards.extract import final_boxed
from rewards.result import NO_ANSWER, OK, VerifyResult
from rlvr_env.prompting import chat_turns, shown_few_shot
from rlvr_env.task import Problem, Task

# A signed integer/decimal, allowing thousands separators ("1,234.5").
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?")
# A \boxed{...} with something other than blanks inside (searched, so linear time).
_FILLED_BOXED = re.compile(r"\\boxed\s*\{\s*[^\s}]")
# Arithmetic left undone: an operator between two operands, a fraction, a root or a factorial.
_UNEVALUATED = re.compile(r"[\d)}.]\s*(?:[-+*/×÷^]|\\times|\\cdot|\\div)\s*[-\d(\\{.]|\\[dt]?frac|\\sqrt|\d\s*!")
# A unit and its exponent ("\text{ m}^2", "\mathrm{cm}^{3}", "^\circ"): not arithmetic, so removed before the check.
_UNIT = re.compile(r"\\(?:text|mbox|mathrm)\s*\{[^{}\d]*\}(?:\s*\^\s*(?:\{[^{}]*\}|\w))?|\^\s*\{?\s*\\circ\s*\}?")


def unevaluated(answer: str) -> bool:
    """True when the answer's final value (after its last "=") is arithmetic, not a number:
    "86 + 67" or "\\frac{306}{2}" equal 153 but restate the question; "86 + 67 = 153" and
    "12 \\text{ m}^2" are fine."""
    return bool(_UNEVALUATED.search(_UNIT.sub(" ", re.split(r"=|\\approx", answer)[-1])))


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (separators removed), or None."""
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


@dataclass(frozen=True)
class LenientAnswer:
    """1.0 when the answer equals the gold: the one ``rewards.math_verifier`` extracts
    (``\\boxed``, "answer is", ...), else, when the completion marks no answer and
    ``fallback_last_number`` is set, the last number in it. With ``literal_answer`` the
    value must be written as a number: an expression that merely equals the gold (the
    question's own ``86 + 67``, which a policy learns to echo within a few GRPO steps)
    scores 0. With ``boxed_only`` only a ``\\boxed{}`` answer counts: a response without one scores 0
    (no "the answer is", no short response read whole, no last number), so the box is the answer, not a bonus."""

    fallback_last_number: bool = True
    literal_answer: bool = False
    boxed_only: bool = False
    in_process_safe = True  # math_verifier bounds itself; the regex is linear

    def __call__(self, completion: str, *, answer: Any, **info: Any) -> VerifyResult:
        if self.boxed_only and isinstance(completion, str) and final_boxed(completion) is None:
            return VerifyResult(0.0, NO_ANSWER, {"reason": "boxed_only: no \\boxed{} answer"})
        result = rewards.math_verifier(completion, answer=answer, **info)
        pred = result.details.get("pred", "")
        # A gold written as arithmetic ("3/4") is itself the literal form, so it is not held against the answer.
        if self.literal_answer and result.score == 1.0 and unevaluated(pred) and not unevaluated(str(answer)):
            return VerifyResult(0.0, OK, {**result.details, "reason": "unevaluated: the answer is arithmetic, not a number"})
        # No marker found: either no answer at all, or a short completion taken whole as the answer.
        unmarked = result.status == NO_ANSWER or result.details.get("pred") == completion.strip()
        if result.score == 1.0 or self.boxed_only or not (unmarked and self.fallback_last_number):
            return result
        number = last_number(completion)
        if number is None:
            return result
        correct = rewards.math_equal(number, str(answer))
        return VerifyResult(float(correct), OK, {"extracted": number, "extraction": "last_number"})


@dataclass(frozen=True)
class BoxedFormat:
    """1.0 when the completion fills a ``\\boxed{}``; format only, never correctness.
    A fixed linear-time pattern, so batch scoring may run it in-process (a user
    regex in ``rewards.format_reward`` goes to the worker pool instead)."""

    in_process_safe = True

    def __call__(self, completion: str, *, answer: Any = None, **info: Any) -> VerifyResult:
        return VerifyResult(1.0 if _FILLED_BOXED.search(completion) else 0.0)


@dataclass(frozen=True)
class AnyAnswer:
    """``verifier`` against each of several accepted answers (a tuple ``answer``; one answer is checked as it is): the
    first best-scoring result, so a completion is right when it equals any of them (verl's list ground truths)."""

    verifier: Any

    @property
    def in_process_safe(self) -> bool:
        return getattr(self.verifier, "in_process_safe", False)

    def __call__(self, completion: str, *, answer: Any, **info: Any) -> VerifyResult:
        if not isinstance(answer, tuple):
            return self.verifier(completion, answer=answer, **info)
        results = [self.verifier(completion, answer=gold, **info) for gold in answer]
        return max(results, key=lambda result: result.score)


def answer_reward(correct_weight: float, format_weight: float, fallback_last_number: bool, literal_answer: bool = False,
                  boxed_only: bool = False):
    """The weighted sum reported as components "correct" and (when weighted) "format"."""
    parts = [("correct", LenientAnswer(fallback_last_number, literal_answer, boxed_only), correct_weight)]
    if format_weight:
        parts.append(("format", BoxedFormat(), format_weight))
    return rewards.WeightedSum(parts)


def validate_answer_weights(correct_weight: float, format_weight: float) -> None:
    for name, weight in (("correct_weight", correct_weight), ("format_weight", format_weight)):
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"{name} must be a finite number, got {weight!r}")
    if not correct_weight > 0:
        raise ValueError(f"correct_weight must be > 0, got {correct_weight}")
    if format_weight < 0:
        raise ValueError(f"format_weight must be >= 0, got {format_weight}")


class AnswerTask(Task):
    """A task whose answer is one number (Arithmetic, GSM8K): graded by answer_reward from its config's
    ``correct_weight``, ``format_weight``, ``fallback_last_number``, ``literal_answer`` and ``boxed_only``; its
    prompts show each ``few_shot`` example with the chance ``few_shot_keep`` (shown_few_shot)."""

    @property
    def verifier(self):
        cfg = self.config
        return answer_reward(cfg.correct_weight, cfg.format_weight, cfg.fallback_last_number, cfg.literal_answer,
                             cfg.boxed_only)

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        """The system prompt, the few-shot pairs this problem shows (``few_shot_keep``), then the problem."""
        cfg = self.config
        return chat_turns(cfg.system_prompt, shown_few_shot(cfg.few_shot, cfg.few_shot_keep, problem), problem.prompt)
