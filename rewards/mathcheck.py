"""Math answer equivalence: `math_equal` (bool) and `math_verifier` (VerifyResult).

Two backends. "native" (the default): fast path in the caller's process, bounded by construction:
extraction, string normal form, our own parser with size guards, exact fractions. Only answers it
cannot decide (symbolic algebra, irrationals) go to a killable worker process that runs sympy under
a hard time limit (sandbox.py). "math-verify": Hugging Face's math-verify (open-r1's and TRL's
accuracy reward) with the same guarantees around it: it runs whole in that worker under the same
limit (from any thread), the model's text is parsed by its LaTeX extraction only (its plain-expression
parser goes through sympy's parse_expr, which evals; the gold may use it), and every result has a status.
"""

from __future__ import annotations

import decimal
import functools
import importlib.util
import math
import numbers
import re
from collections.abc import Hashable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from .compare import TooLarge, canonical, equivalent, exact_scalar_equal, exact_value
from .extract import SHORT_ANSWER_CHARS, extract_answer
from .latex import MAX_ANSWER_CHARS, ParseError, normalize, parse_answer
from .result import ERROR, NO_ANSWER, OK, TIMEOUT, VerifyResult
from .sandbox import CheckTimeout, WorkerError, run_limited


def answer_key(answer: str) -> Hashable:
    """A key two answers share when they are written alike up to form, for counting votes (maj@N): numbers by exact
    value (1/2, \\frac{1}{2} and 0.5 alike), sums, products and sets in any order (the equality test's canonical
    form); an answer outside the grammar by its normal form. In this process and cheap: the parser's bounds and exact
    arithmetic under its size guard, never the symbolic worker, so x^2-1 and (x-1)(x+1) stay two answers."""
    text = str(answer)[:MAX_ANSWER_CHARS]
    try:
        tree = parse_answer(text)
    except Exception:  # model output never raises: outside the grammar (or a parser bug), the text is the key
        return ("text", normalize(text))
    try:
        value = exact_value(tree)
    except Exception:  # too large under the guard, a division by zero: no value, the tree's shape is the key
        value = None
    return ("num", value) if value is not None else canonical(tree)


# Integers are most answers (arithmetic, GSM8K, counting); bounded so int() stays cheap.
_PLAIN_INTEGER = re.compile(r"[-+]?\d{1,64}")
# "or" after a value (a digit, a bracket, a math delimiter) and before another
_GOLD_OR_RE = re.compile(r"(?<=[\d)\]}$])\s*(?:\\text\s*\{\s*or\s*\}|\bor\b)\s*(?=[\w(\[{$\\-])")
DEFAULT_TIMEOUT_S = 5.0  # math-verify's default per comparison
BACKENDS = ("native", "math-verify")
MATH_VERIFY_INSTALL = "pip install 'rlvr-env[math-verify]'"
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


def _in_math_mode(text: str) -> str:
    """A bare short answer ("5/4", "x^2+1") in $...$, math-verify's documented convention for a gold: its LaTeX
    extraction reads only what is marked as math. Text with its own delimiters, or a response, is left as it is."""
    marked = any(mark in text for mark in ("$", "\\(", "\\[", "\\boxed", "\\fbox"))
    return text if marked or "\n" in text.strip() or len(text) > SHORT_ANSWER_CHARS else f"${text.strip()}$"


def _math_verify_check(completion: str, gold: str) -> list:
    """Runs inside the worker: math-verify's verdict as [equal, found] (found: the completion had an answer its
    LaTeX extraction reads), its own signal timeouts off (the worker's kill is the limit)."""
    from math_verify import LatexExtractionConfig, parse, verify

    gold_parsed = parse(_in_math_mode(gold), parsing_timeout=None)
    pred_parsed = parse(_in_math_mode(completion), extraction_config=[LatexExtractionConfig()], parsing_timeout=None)
    if not pred_parsed:
        return [False, False]
    return [bool(verify(gold_parsed, pred_parsed, timeout_seconds=None)), True]


def _math_verify_result(completion: str, gold: str, timeout: float) -> VerifyResult:
    details: dict[str, Any] = {"gold": gold[:200], "method": "math-verify"}
    try:
        equal, found = run_limited(_math_verify_check, (completion, gold), timeout)
    except CheckTimeout:
        return VerifyResult(0.0, TIMEOUT, {**details, "timeout_s": timeout})
    except WorkerError as exc:
        return VerifyResult(0.0, ERROR, {**details, "reason": str(exc)[:300]})
    return VerifyResult(float(bool(equal)), OK if found else NO_ANSWER, details)


def math_verifier(completion: str, *, answer: Any, timeout: float | None = None, backend: str = "native",
                  **info: Any) -> VerifyResult:
    """1.0 if the completion's final answer equals `answer`, else 0.0; status says why (ok/no_answer/timeout/error).

    `timeout` (seconds) bounds the symbolic step (the whole check with ``backend="math-verify"``); default
    CHECK_TIMEOUT_S (5 s unless score_batch sets it). `backend`: "native" or "math-verify" (see the module).
    """
    if backend not in BACKENDS:
        raise ValueError(f"math_verifier backend must be one of {BACKENDS}, got {backend!r}")
    if not isinstance(completion, str):
        return VerifyResult(0.0, ERROR, {"reason": f"completion is {type(completion).__name__}, not str"})
    if timeout is not None and not (isinstance(timeout, numbers.Real) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"math_verifier timeout must be a finite number of seconds > 0, got {timeout!r}")
    try:
        gold = _gold_text(answer)
    except (TypeError, ValueError) as exc:  # a dataset problem, reported per row: status error, with the reason
        return VerifyResult(0.0, ERROR, {"reason": str(exc)})
    if backend == "math-verify":
        require_math_verify()
        return _math_verify_result(completion, gold, CHECK_TIMEOUT_S.get() if timeout is None else timeout)
    try:
        pred = extract_answer(completion)
        if pred is None:
            return VerifyResult(0.0, NO_ANSWER, {"gold": gold[:200]})
        score, status, details = compare_answers(pred, gold, CHECK_TIMEOUT_S.get() if timeout is None else timeout)
    except Exception as exc:  # the contract: model output never raises; a checker bug is an error status
        return VerifyResult(0.0, ERROR, {"gold": gold[:200], "reason": f"{type(exc).__name__}: {str(exc)[:300]}"})
    return VerifyResult(score, status, details)


math_verifier.in_process_safe = True  # bounded: its only unbounded step runs in the sandbox


@functools.cache  # math_verifier asks at every check; the answer does not change in a process
def require_math_verify() -> None:
    """ImportError saying how to install math-verify, where it is not."""
    if importlib.util.find_spec("math_verify") is None:
        raise ImportError(f"the math-verify backend needs math-verify: {MATH_VERIFY_INSTALL}")


@dataclass(frozen=True)
class MathVerifier:
    """math_verifier with its options fixed, picklable for score_batch's pool and the adapters:
    ``make_trl_reward(MathVerifier(backend="math-verify"))``."""

    backend: str = "native"
    timeout: float | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"MathVerifier backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.backend == "math-verify":
            require_math_verify()

    @property
    def in_process_safe(self) -> bool:  # both backends bound their unbounded steps by the worker
        return True

    def __call__(self, completion: str, *, answer: Any, **info: Any) -> VerifyResult:
        return math_verifier(completion, answer=answer, timeout=self.timeout, backend=self.backend)


def math_equal(pred: str, gold: str, *, timeout: float | None = None, backend: str = "native") -> bool:
    """Is `pred` (a short answer or a whole response, any text: never raises on it) the same answer as `gold`?
    False if it cannot tell. A missing `gold` (None, blank, not a string or number) is the caller's bug, not a
    "no": ValueError naming it, where math_verifier reports it as status error. A gold that is there but unusable
    (an empty \\boxed{}, inf) is False, as every other answer it cannot compare."""
    if gold is None or isinstance(gold, bool) or not isinstance(gold, (str, numbers.Real)) or not str(gold).strip():
        raise ValueError(f"math_equal: the gold answer is missing: got {gold!r}")
    return math_verifier(pred, answer=gold, timeout=timeout, backend=backend).score == 1.0
