"""math_verifier's verdict on each of its paths: the score, the status and the details that say how it decided
(the `rlvr verify` output and score_batch's rows show them), and the worker's functions called in this process."""

import pytest

from rewards import VerifyResult, math_verifier
from rewards import mathcheck
from rewards.latex import MAX_ANSWER_CHARS
from rewards.sandbox import WorkerError


@pytest.mark.parametrize("pred, gold, score, method", [
    ("7", "7", 1.0, "string"),  # the same text
    ("-007", "7", 0.0, "exact"),  # two plain integers, compared as integers
    ("+7", "7", 1.0, "exact"),
    ("\\frac{1}{2}", "\\dfrac{1}{2}", 1.0, "string"),  # the same normal form
    ("0.5", "\\frac{1}{2}", 1.0, "exact"),  # parsed, exact fractions
    ("x^2-1", "(x-1)(x+1)", 1.0, "symbolic"),  # sympy, in the worker
    ("\\sqrt{2}/2", "1/\\sqrt{3}", 0.0, "symbolic"),
])
def test_each_path_says_how_it_decided(pred, gold, score, method):
    result = math_verifier(f"\\boxed{{{pred}}}", answer=gold)
    assert (result.score, result.status, result.details) == (score, "ok", {"pred": pred, "gold": gold, "method": method})


def test_an_answer_that_does_not_parse_is_wrong_with_the_parsers_reason():
    result = math_verifier("\\boxed{3 +* 4}", answer="7")
    assert (result.score, result.status, result.details["method"]) == (0.0, "ok", "unparsed")
    assert result.details["reason"] and len(result.details["reason"]) <= 200


def test_answers_past_the_parsers_limit_are_compared_as_text():
    long = "1+" * (MAX_ANSWER_CHARS // 2) + "1"  # one past the limit, and 501 ones, not parsed
    assert len(long) == MAX_ANSWER_CHARS + 1
    assert mathcheck.compare_answers(long, "501", 5.0) == (0.0, "ok", {"pred": long[:200], "gold": "501", "method": "string"})
    assert mathcheck.compare_answers("501", long, 5.0)[0::2] == (0.0, {"pred": "501", "gold": long[:200], "method": "string"})
    assert mathcheck.compare_answers(f" {long}", long, 5.0)[0] == 1.0  # blanks aside
    at_limit = long[2:]  # the limit itself is still parsed: 500 ones
    assert len(at_limit) == MAX_ANSWER_CHARS - 1 and mathcheck.compare_answers(at_limit + "0", "5000", 5.0)[0::2] == (
        0.0, {"pred": (at_limit + "0")[:200], "gold": "5000", "method": "exact"})
    assert mathcheck.compare_answers("500", at_limit, 5.0)[0::2] == (1.0, {"pred": "500", "gold": at_limit[:200], "method": "exact"})


def test_a_symbolic_check_past_its_limit_or_a_dead_worker_scores_zero_with_its_status(monkeypatch):
    result = math_verifier("\\boxed{x^2-1}", answer="(x-1)(x+1)", timeout=1e-6)
    assert (result.score, result.status, result.details) == (
        0.0, "timeout", {"pred": "x^2-1", "gold": "(x-1)(x+1)", "method": "symbolic", "timeout_s": 1e-6})

    def dies(*args, **kwargs):
        raise WorkerError("the worker died: " + "x" * 400)

    monkeypatch.setattr(mathcheck, "run_limited", dies)
    result = math_verifier("\\boxed{x^2-1}", answer="(x-1)(x+1)")
    assert (result.score, result.status, result.details) == (
        0.0, "error", {"pred": "x^2-1", "gold": "(x-1)(x+1)", "method": "symbolic",
                       "reason": ("the worker died: " + "x" * 400)[:300]})


def test_the_math_verify_backends_timeout_and_dead_worker_score_zero_with_their_status(monkeypatch):
    pytest.importorskip("math_verify")
    gold = "1" * 250
    result = math_verifier("\\boxed{7}", answer=gold, backend="math-verify", timeout=1e-6)
    assert (result.score, result.status, result.details) == (
        0.0, "timeout", {"gold": gold[:200], "method": "math-verify", "timeout_s": 1e-6})
    monkeypatch.setattr(mathcheck, "run_limited", lambda *args, **kwargs: (_ for _ in ()).throw(WorkerError("gone")))
    result = math_verifier("\\boxed{7}", answer="7", backend="math-verify")
    assert (result.score, result.status, result.details) == (0.0, "error", {"gold": "7", "method": "math-verify", "reason": "gone"})


@pytest.mark.parametrize("answer, reason", [
    ("  ", "gold answer is blank"),
    ([7], "gold answer must be a string or a number, got list"),
    (float("nan"), "gold answer nan is not a finite number"),
    ("\\boxed{}", "gold answer '\\\\boxed{}' marks an answer but holds none (an empty \\boxed{} or ####)"),
])
def test_an_unusable_gold_is_an_error_row_that_names_it(answer, reason):
    assert math_verifier("\\boxed{7}", answer=answer) == VerifyResult(0.0, "error", {"reason": reason})


@pytest.mark.parametrize("text, marked", [
    ("5/4", "$5/4$"),
    (" x^2+1 ", "$x^2+1$"),
    ("$5/4$", "$5/4$"),  # delimited already
    ("\\(5/4\\)", "\\(5/4\\)"),
    ("\\[5/4\\]", "\\[5/4\\]"),
    ("\\boxed{5}", "\\boxed{5}"),
    ("\\fbox{5}", "\\fbox{5}"),
    ("5\n4", "5\n4"),  # a response, not an answer
    ("1" * 80, "$" + "1" * 80 + "$"),
    ("1" * 81, "1" * 81),
])
def test_math_verify_reads_a_bare_short_answer_as_maths(text, marked):
    assert mathcheck._in_math_mode(text) == marked


def test_the_worker_functions_give_their_verdicts_in_this_process_too():
    """What the worker runs, called directly (the tests above see it only through the worker's reply)."""
    assert mathcheck._symbolic_check("x^2-1", "(x-1)(x+1)") is True
    assert mathcheck._symbolic_check("x^2+1", "(x-1)(x+1)") is False
    pytest.importorskip("math_verify")
    assert mathcheck._math_verify_check("so it is $\\boxed{\\frac{1}{2}}$", "0.5") == [True, True]
    assert mathcheck._math_verify_check("so it is $\\boxed{3}$", "0.5") == [False, True]
    rambling = "I am not sure what the answer is; let me think about the problem some more before I answer it."
    assert mathcheck._math_verify_check(rambling, "0.5") == [False, False]  # no maths found: no answer
