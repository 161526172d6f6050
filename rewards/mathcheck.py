"""Math answer equivalence: `math_equal` (bool) and `math_verifier` (VerifyResult).

Fast path in the caller's process, bounded by construction: extraction, string
normal form, our own parser with size guards, exact fractions. Only answers it
cannot decide (symbolic algebra, irrationals) go to a killable worker process
that runs sympy under a hard time limit (sandbox.py).
"""

from __future__ import annotations

import decimal
import math
import numbers
import re
from contextvars import ContextVar
from typing import Any

from .compare import TooLarge, equivalent, exact_scalar_equal
from .extract import SHORT_ANSWER_CHARS, extract_answer
from .latex import MAX_ANSWER_CHARS, ParseError, normalize, parse_answer
from .result import ERROR, NO_ANSWER, OK, TIMEOUT, VerifyResult
from .sandbox import CheckTimeout, WorkerError, run_limited

# Integers are most answers (arithmetic, GSM8K, counting); bounded so int() stays cheap.
_PLAIN_INTEGER = re.compile(r"[-+]?\d{1,64}")
# "or" after a value (a digit, a bracket, a math delimiter) and before another
_GOLD_OR_RE = re.compile(r"(?<=[\d)\]}$])\s*(?:\\text\s*\{\s*or\s*\}|\bor\b)\s*(?=[\w(\[{$\\-])")
DEFAULT_TIMEOUT_S = 5.0  # math-verify's default per comparison
# score_batch sets this so verifiers called without an explicit timeout use the batch's limit
CHECK_TIMEOUT_S: ContextVar[float] = ContextVar("rewards_check_timeout_s", default=DEFAULT_TIMEOUT_S)


def _symbolic_check(pred: str, gold: str) -> bool | None:
    """Runs inside the worker: the full comparison with sympy leaves."""
    from .symbolic import sympy_scalar_equal

    return equivalent(parse_answer(pred), parse_answer(gold), sympy_scalar_equal)


def _gold_text(answer: Any) -> str:
    """The gold answer as text; ValueError when there is none (a blank string, an empty box, inf/nan)."""
    # numbers.* so NumPy scalars from a parquet column count too (repr(np.float64(72.0)) is 'np.float64(72.0)')
    if isinstance(answer, numbers.Integral) and not isinstance(answer, bool):
        return str(int(answer))
    if isinstance(answer, numbers.Real) and not isinstance(answer, bool):
        # Positional digits: "3e-05" would read as 3e - 5 (Euler's e). A NumPy float32's str is its own shortest
        # text ("0.1"); float() of it would be 0.10000000149011612.
        value = decimal.Decimal(repr(answer) if type(answer) is float else str(answer))
        if not value.is_finite():
            raise ValueError(f"gold answer {answer!r} is not a finite number")
        return format(value, "f")
    if not isinstance(answer, str):
        raise TypeError(f"gold answer must be a string or a number, got {type(answer).__name__}")
    if not answer.strip():
        raise ValueError("gold answer is blank")
    if "\\boxed" in answer or "\\fbox" in answer or "####" in answer:
        marked = extract_answer(answer, reference=True)
        if marked is None or marked == answer.strip():  # no marked answer found: only the text itself came back
            raise ValueError(f"gold answer {answer[:200]!r} marks an answer but holds none (an empty \\boxed{{}} or ####)")
        answer = marked
    elif len(answer) > SHORT_ANSWER_CHARS or "\n" in answer.strip():  # a worked solution: its stated final answer
        answer = extract_answer(answer, reference=True) or answer
    # a reference names every answer: "(11,7) or (7,11)" and "$21,16$ or $11$" are lists (in a response, a hedge)
    return _GOLD_OR_RE.sub(" and ", answer)


def compare_answers(pred: str, gold: str, timeout: float) -> tuple[float, str, dict]:
    """(score, status, details) for an extracted answer against the gold answer."""
    details: dict[str, Any] = {"pred": pred[:200], "gold": gold[:200]}
    if len(pred) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:  # too long to parse: exact text only
        return float(pred.strip() == gold.strip()), OK, {**details, "method": "string"}
    if pred == gold:
        return 1.0, OK, {**details, "method": "string"}
    if _PLAIN_INTEGER.fullmatch(pred) and _PLAIN_INTEGER.fullmatch(gold):  # the common case, decided without parsing
        return float(int(pred) == int(gold)), OK, {**details, "method": "exact"}
    if normalize(pred) == normalize(gold):
        return 1.0, OK, {**details, "method": "string"}
    try:
        pred_tree, gold_tree = parse_answer(pred), parse_answer(gold)
    except (ParseError, RecursionError) as exc:
        return 0.0, OK, {**details, "method": "unparsed", "reason": str(exc)[:200]}
    try:
        verdict = equivalent(pred_tree, gold_tree, exact_scalar_equal)
    except TooLarge:
        verdict = None
    if verdict is not None:
        return float(verdict), OK, {**details, "method": "exact"}
    try:
        verdict = run_limited(_symbolic_check, (pred, gold), timeout)
    except CheckTimeout:
        return 0.0, TIMEOUT, {**details, "method": "symbolic", "timeout_s": timeout}
    except WorkerError as exc:
        return 0.0, ERROR, {**details, "method": "symbolic", "reason": str(exc)[:300]}
    return float(bool(verdict)), OK, {**details, "method": "symbolic"}


def math_verifier(completion: str, *, answer: Any, timeout: float | None = None, **info: Any) -> VerifyResult:
    """1.0 if the completion's final answer equals `answer`, else 0.0; status says why (ok/no_answer/timeout/error).

    `timeout` (seconds) bounds the symbolic step; default CHECK_TIMEOUT_S (5 s unless score_batch sets it).
    """
    if not isinstance(completion, str):
        return VerifyResult(0.0, ERROR, {"reason": f"completion is {type(completion).__name__}, not str"})
    if timeout is not None and not (isinstance(timeout, numbers.Real) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"math_verifier timeout must be a finite number of seconds > 0, got {timeout!r}")
    try:
        gold = _gold_text(answer)
    except (TypeError, ValueError) as exc:  # a dataset problem, reported per row: status error, with the reason
        return VerifyResult(0.0, ERROR, {"reason": str(exc)})
    try:
        pred = extract_answer(completion)
        if pred is None:
            return VerifyResult(0.0, NO_ANSWER, {"gold": gold[:200]})
        score, status, details = compare_answers(pred, gold, CHECK_TIMEOUT_S.get() if timeout is None else timeout)
    except Exception as exc:  # the contract: model output never raises; a checker bug is an error status
        return VerifyResult(0.0, ERROR, {"gold": gold[:200], "reason": f"{type(exc).__name__}: {str(exc)[:300]}"})
    return VerifyResult(score, status, details)


math_verifier.in_process_safe = True  # bounded: its only unbounded step runs in the sandbox


def math_equal(pred: str, gold: str, *, timeout: float | None = None) -> bool:
    """Is `pred` (a short answer or a whole response) the same answer as `gold`? False if it cannot tell."""
    return math_verifier(pred, answer=gold, timeout=timeout).score == 1.0
