"""math_verifier's verdict on each of its paths: the score, the status and the details that say how it decided
(the `rlvr verify` output and score_batch's rows show them), and the worker's functions called in this process."""

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import sympy

from rewards import MathVerifier, VerifyResult, math_equal, math_verifier, mathcheck, symbolic
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
    at_limit = long[2:] + "0"  # the limit itself is still parsed: 499 ones and a 10
    assert len(at_limit) == MAX_ANSWER_CHARS
    assert mathcheck.compare_answers(at_limit, "5000", 5.0)[0::2] == (
        0.0, {"pred": at_limit[:200], "gold": "5000", "method": "exact"})
    assert mathcheck.compare_answers("509", at_limit, 5.0)[0::2] == (
        1.0, {"pred": "509", "gold": at_limit[:200], "method": "exact"})


@pytest.mark.parametrize("pred, reason", [
    ("2^{10^{9}}", "TooLarge: exponent too large"),
    ("(10^{9})!", "TooLarge: factorial too large"),
])
def test_a_value_too_large_to_build_could_not_be_checked(pred, reason):
    """The size guards refuse it in this process and in the worker: status error (docs/rewards.md, Statuses), score 0."""
    result = math_verifier(f"\\boxed{{{pred}}}", answer="5")
    assert (result.score, result.status, result.details) == (
        0.0, "error", {"pred": pred, "gold": "5", "method": "symbolic", "reason": reason})


def _dying_worker(message: str):
    """A stand-in for run_limited whose worker dies with ``message``."""
    def run_limited(*args, **kwargs):
        raise WorkerError(message)

    return run_limited


def test_a_symbolic_check_past_its_limit_or_a_dead_worker_scores_zero_with_its_status(monkeypatch):
    result = math_verifier("\\boxed{x^2-1}", answer="(x-1)(x+1)", timeout=1e-6)
    assert (result.score, result.status, result.details) == (
        0.0, "timeout", {"pred": "x^2-1", "gold": "(x-1)(x+1)", "method": "symbolic", "timeout_s": 1e-6})

    monkeypatch.setattr(mathcheck, "run_limited", _dying_worker("the worker died: " + "x" * 400))
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
    gone = "the worker is gone: " + "x" * 400
    monkeypatch.setattr(mathcheck, "run_limited", _dying_worker(gone))
    result = math_verifier("\\boxed{7}", answer="7", backend="math-verify")
    assert (result.score, result.status, result.details) == (
        0.0, "error", {"gold": "7", "method": "math-verify", "reason": gone[:300]})


@pytest.mark.parametrize("answer, reason", [
    ("  ", "gold answer is blank"),
    ([7], "gold answer must be a string or a number, got list"),
    (float("nan"), "gold answer nan is not a finite number"),
    ("\\boxed{}", "gold answer '\\\\boxed{}' marks an answer but holds none (an empty \\boxed{} or ####)"),
    ("\\fbox{ }", "gold answer '\\\\fbox{ }' marks an answer but holds none (an empty \\boxed{} or ####)"),
    ("1" * 300 + "\n####", f"gold answer {('1' * 300 + chr(10) + '####')[:200]!r} marks an answer but holds none "
                           "(an empty \\boxed{} or ####)"),
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


def test_constants_simplify_leaves_unproved_are_equal_when_they_agree_to_forty_digits():
    """simplify keeps log(6) whole and leaves sin(log(6)/log(2)) - sin(1 + log(3)/log(2)) unproved: a fuzz of one
    expression in two renderings found it. Closed forms that differ part long before 40 digits."""
    pred = "\\sqrt[3]{\\log_{2} 10} - \\sin(\\log_{2} 6)"
    gold = "-\\sin(\\frac{\\ln 6}{\\ln 2}) + (\\frac{\\ln 10}{\\ln 2})^{1/3}"
    result = math_verifier(f"\\boxed{{{pred}}}", answer=gold)
    assert (result.score, result.status, result.details["method"]) == (1.0, "ok", "symbolic")
    assert not math_equal("e^{\\pi\\sqrt{163}}", "262537412640768744")  # an integer to 12 places, no further
    assert not math_equal("10^{30}\\pi + 1", "10^{30}\\pi") and not math_equal("\\sin(10^{50})", "0")
    one = sympy.Integer(1)
    assert symbolic._agree_to_digits(one + sympy.Rational(1, 10**41), one, 40)
    assert not symbolic._agree_to_digits(one + sympy.Rational(1, 10**39), one, 40)
    assert symbolic._agree_to_digits(10**50 * (one + sympy.Rational(1, 10**41)), 10**50 * one, 40)  # relative
    assert not symbolic._agree_to_digits(sympy.exp(-1000), 2 * sympy.exp(-1000), 40)  # relative below 1 too
    assert not math_equal("e^{-200}", "2e^{-200}") and not symbolic._agree_to_digits(sympy.Symbol("x"), one, 40)


def test_the_worker_functions_give_their_verdicts_in_this_process_too():
    """What the worker runs, called directly (the tests above see it only through the worker's reply)."""
    assert mathcheck._symbolic_check("x^2-1", "(x-1)(x+1)") is True
    assert mathcheck._symbolic_check("x^2+1", "(x-1)(x+1)") is False
    pytest.importorskip("math_verify")
    assert mathcheck._math_verify_check("so it is $\\boxed{\\frac{1}{2}}$", "0.5") == [True, True]
    assert mathcheck._math_verify_check("so it is $\\boxed{3}$", "0.5") == [False, True]
    rambling = "I am not sure what the answer is; let me think about the problem some more before I answer it."
    assert mathcheck._math_verify_check(rambling, "0.5") == [False, False]  # no maths found: no answer
    # the model's text is read by math-verify's LaTeX extraction only (its plain-expression parser would find this 7)
    plain = "I worked through all of the steps carefully and at the very end the result that I got is 7"
    assert mathcheck._math_verify_check(plain, "7") == [False, False]


@pytest.mark.parametrize("gold", [
    "We add 2 and 3.\nThe answer is 5",  # several lines: a worked solution
    "Adding the two numbers on the board together gives us the total, so the answer is 5",  # one line past 80
])
def test_a_gold_that_is_a_worked_solution_is_read_for_its_stated_answer(gold):
    assert math_verifier("\\boxed{5}", answer=gold).details["gold"] == "5"


def test_a_short_gold_is_the_answer_itself():
    gold = "The answer is " + "1+" * 32 + "11"  # 80 characters on one line: compared whole, not read as a solution
    assert len(gold) == 80 and math_verifier("\\boxed{43}", answer=gold).details["gold"] == gold
    assert math_verifier("\\boxed{44}", answer=gold + "+1").details["gold"] == "1+" * 32 + "11+1"  # 82: a solution


def test_math_verifier_objects_and_math_equal_pass_their_options_on(monkeypatch):
    refusal = "MathVerifier backend must be one of ('native', 'math-verify'), got 'sympy'"
    with pytest.raises(ValueError, match=re.escape(refusal)):
        MathVerifier(backend="sympy")
    symbolic = ("\\boxed{x^2-1}", "(x-1)(x+1)")
    assert MathVerifier(timeout=1e-6)(symbolic[0], answer=symbolic[1]).status == "timeout"
    assert math_equal(*symbolic) and not math_equal(*symbolic, timeout=1e-6)
    pytest.importorskip("math_verify")
    assert MathVerifier(backend="math-verify")(symbolic[0], answer=symbolic[1]).details["method"] == "math-verify"
    # math-verify's LaTeX extraction reads no maths in a sentence without delimiters; ours reads its stated value
    assert math_equal("The answer is 5 apples", "5") and not math_equal("The answer is 5 apples", "5", backend="math-verify")

    def missing():
        raise ImportError("the math-verify backend needs math-verify")

    monkeypatch.setattr(mathcheck, "require_math_verify", missing)
    assert MathVerifier().backend == "native"  # only the math-verify backend asks for it
    with pytest.raises(ImportError, match="needs math-verify"):
        MathVerifier(backend="math-verify")


def test_math_verify_runs_from_any_thread():
    """Its own timeouts use signal.alarm, main thread only: they are off (the worker's kill is the limit)."""
    pytest.importorskip("math_verify")
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(mathcheck._math_verify_check, "so $\\boxed{1}$", "1").result() == [True, True]


def test_a_references_or_names_every_answer():
    result = math_verifier("\\boxed{(7,11), (11,7)}", answer="(11,7) or (7,11)")
    assert (result.score, result.details["gold"]) == (1.0, "(11,7) and (7,11)")


def test_no_answer_non_text_and_a_checker_bug_each_get_their_row(monkeypatch):
    gold = "5" * 250
    unfinished = "I could not finish the working before I ran out of room, sorry about that, maybe next time"
    assert math_verifier(unfinished, answer=gold) == VerifyResult(0.0, "no_answer", {"gold": gold[:200]})
    assert math_verifier(5, answer="5") == VerifyResult(0.0, "error", {"reason": "completion is int, not str"})

    def broken(pred, gold, timeout):
        raise RuntimeError("a bug " + "x" * 400)

    monkeypatch.setattr(mathcheck, "compare_answers", broken)
    assert math_verifier("\\boxed{5}", answer=gold) == VerifyResult(
        0.0, "error", {"gold": gold[:200], "reason": "RuntimeError: " + ("a bug " + "x" * 400)[:300]})
