"""Regressions from a review of answer extraction: quadratic whitespace runs, blank boxes and tags echoed
from the prompt, common phrasings, and reasoning-gym's tags-first order."""

import time

import pytest

from rewards import extract_answer, math_verifier
from rewards.extract import tagged_answer

# "The answer is 153" and then a run of blanks: the stated answer's ending "\s*I hope" rescanned the run
# from each of its positions (2.7 s for 20k blanks, 9.7 s for 40k; minutes for these). Now ~20 ms each.
BLANK_RUNS = {
    "spaces": "86 + 67 = 153. The answer is 153" + " " * 200_000,
    "tabs": "The answer is 153" + "\t" * 200_000,
    "blanks before I hope": "The answer is 153" + " \t" * 100_000 + "I hope it is correct.",
    "after a box": "\\boxed{150} Final answer is 153" + " " * 200_000,
    "bold": "The answer is **153**" + " " * 200_000,
    "newlines before the answer": "\n" * 200_000 + "The answer is 153",
}


@pytest.mark.parametrize("name", BLANK_RUNS)
def test_a_long_run_of_blanks_is_linear(name):
    start = time.perf_counter()
    result = math_verifier(BLANK_RUNS[name], answer="153")
    assert time.perf_counter() - start < 3.0  # generous: the old code needed minutes
    assert (result.score, result.status, result.details["pred"]) == (1.0, "ok", "153")


@pytest.mark.parametrize("text, expected", [
    ("The answer is " + "1" * 200_000, "1" * 200_000),
    ("the answer is " * 15_000, "the answer is"),
    ("{" * 200_000, None),
    ("\\" * 200_000, None),
    ("The answer is: so x " + "= " * 100_000 + "5", "5"),
    ("The answer is 5 (" + "abc " * 50_000 + ")", "5"),
    ("The answer is 5" + "!" * 200_000, "5"),
    ("<answer> </answer>" * 12_000, None),
    ("\\boxed{" * 40_000 + "1" + "}" * 40_000, "1"),  # each level copied the rest: 7.6 s and 3 GB at 160 KB
])
def test_other_long_adversarial_runs_keep_their_answers(text, expected):
    start = time.perf_counter()
    assert extract_answer(text) == expected
    assert time.perf_counter() - start < 3.0


@pytest.mark.parametrize("text, expected", [
    ("The answer is 153. Put your final answer within \\boxed{}.", "153"),
    ("The answer is 153.\n\\boxed{ }", "153"),
    ("\\boxed{3}. Put your final answer within \\boxed{}.", "3"),
    ("\\boxed{ } \\boxed{7}", "7"),  # not a list "7" and ""
    ("<answer>5</answer> Give only your final answer inside <answer></answer> tags.", "5"),
    ("Give only your final answer inside <answer></answer> tags. The answer is 5.", "5"),
    # taken whole, so the tasks' last-number fallback (LenientAnswer) still reads 153
    ("93 + 82 = 153. Put your final answer within \\boxed{}.", "93 + 82 = 153. Put your final answer within \\boxed{}."),
])
def test_a_blank_box_or_tag_is_the_prompt_echoed_not_an_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("<think>2+2=4</think><answer>The answer is 4</answer>", "4"),
    ("<answer>The final answer is 4.</answer>", "4"),
    ("<answer>\nAnswer: \\boxed{4}\n</answer>", "4"),
    ("<answer>(3 * 8) / 1 = 24</answer>", "(3 * 8) / 1 = 24"),  # no marker: the whole content (Countdown)
    ("2 * 21 = 42, so the answer is 42!", "42"),
    ("The answer is 42! I hope it is correct.", "42"),
    ("the answer is 5! = 120", "5! = 120"),  # a factorial inside the statement stays
    ("The answer is $5!$.", "$5!$"),
    ("\\boxed{5!}", "5!"),
    ("Rechecking: the answer is 6 (not 5).", "6"),
    ("The answer is 12 (in cm).", "12"),
    ("The answer is (2, 4).", "(2, 4)"),  # a value, not a remark
    ("The answer is \\left(1, 2\\right).", "\\left(1, 2\\right)"),
    ("Therefore x = 3.", "3."),
    ("So 2 + 2 = 4", "4"),
    ("Therefore x >= 3.", "Therefore x >= 3."),  # ">=" is not "="
    ("We get 2 + 2 = 4 apples", "We get 2 + 2 = 4 apples"),  # words after "=": not reduced
    ("Therefore x = 3 or x = 4.", "Therefore x = 3 or x = 4."),  # a hedge stays whole
    ("So x is 3 or x is 4", "So x is 3 or x is 4"),
    ("Therefore, A = 5 and B = 6.", "Therefore, A = 5 and B = 6."),
    ("Whether a is positive or negative, the result is 5", "5"),
    ("Since a is 2 and b is 3, the product is 6", "6"),
    # not remarks: a factor or argument in brackets, and a 2-letter product
    ("The answer is 2(x^2 + xy + y^2).", "2(x^2 + xy + y^2)"),
    ("(x+y)(x^2 - xy + y^2)", "(x+y)(x^2 - xy + y^2)"),
    ("The factorization is 3(ab + 1)", "3(ab + 1)"),
    ("The answer is \\log(ab)", "\\log(ab)"),
    ("The answer is 4 \\cdot (de)", "4 \\cdot (de)"),
    # "=" only where no "is"/"are" states the value, and a list of "=" stays whole
    ("The final answer is: the roots are x = 1, x = 2.", "x = 1, x = 2"),
    ("The dimensions are l = 4, w = 5", "l = 4, w = 5"),
    ("Final Answer: the function is f(x) = x^2 + 1", "f(x) = x^2 + 1"),
    ("Therefore, the total cost is 5 * 3 = 15 dollars.", "5 * 3 = 15 dollars."),
    ("Therefore x = 1, x = 2", "Therefore x = 1, x = 2"),
    ("The answer is x = 5 when y = 2", "x = 5 when y = 2"),  # not 2
    ("So x = y = 3", "3"),
])
def test_common_phrasings_are_reduced_to_their_value(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, gold, score", [
    ("<think>2+2=4</think><answer>The answer is 4</answer>", "4", 1.0),
    ("<answer>The final answer is 4.</answer>", "4", 1.0),
    ("2 * 21 = 42, so the answer is 42!", "42", 1.0),
    ("Rechecking: the answer is 6 (not 5).", "6", 1.0),
    ("Therefore x = 3.", "3", 1.0),
    ("the answer is 5! = 120", "120", 1.0),
    ("Therefore x = 3 or x = 4.", "4", 0.0),
])
def test_common_phrasings_score_as_math_verify_does(text, gold, score):
    assert math_verifier(text, answer=gold).score == score


def test_the_math_extractor_keeps_the_box_first_order():
    text = "first guess \\boxed{0}, no.\n<answer>7</answer>"
    assert (extract_answer(text), tagged_answer(text)) == ("0", "7")
    assert tagged_answer("no tags, \\boxed{3}") is None


def test_reasoning_gym_prefers_its_answer_tag_over_an_earlier_box():
    pytest.importorskip("reasoning_gym")
    import rlvr_env

    task = rlvr_env.make_task("rg.basic_arithmetic")
    problem = task.problem(0, seed=0)
    gold = problem.answer["answer"]
    completion = f"Let me try: first guess \\boxed{{0}}, no, that is wrong; recompute.\n<answer>{gold}</answer>"
    result = task.verifier(completion, answer=problem.answer)
    assert (result.score, result.details["statuses"]["correct"]) == (1.0, "ok")
    assert task.verifier("So the answer is \\boxed{0}.", answer=problem.answer).score == 0.0  # no tag: the box still counts


WORKING = "Let x be the number of apples. Then 3x + 2 = 14, so 3x = 12 and x = 4. Each basket holds 4 apples too. "


@pytest.mark.parametrize("text, expected", [
    # a finished response's last sentence that opens with a conclusion states its value
    (WORKING + "Therefore, the number of apples is 4.", "4"),
    (WORKING + "Thus there are 12 baskets in all.", "12"),
    (WORKING + "Hence the probability is $\\frac{2}{3}$.", "$\\frac{2}{3}$"),
    (WORKING + "So the error increases by 100%.", "100%"),
    (WORKING + "$y = 8.8 - 2.8 = 6$ So, the pair $(x, y)$ that solves it is $(7, 6)$.", "$(7, 6)$"),
    (WORKING + "Therefore, the answer follows.\n\nIn conclusion, x = 4.", "x = 4"),
    # end-of-turn text from a raw decode and the closing formula do not hide it
    (WORKING + "Therefore, x is 4. I hope it is correct. <|im_start|>user", "4"),
    (WORKING + "Therefore, x is 4.<|im_end|>", "4"),
    # cut off mid-sentence, no conclusion, or a conclusion that is not the last sentence: working, no answer
    (WORKING + "Therefore, x is 4", None),
    (WORKING + "Therefore, x is 4. Now check the second basket.", None),
    (WORKING + "The number of apples is 4.", None),
    (WORKING + "Therefore, we have 4 apples and 3 pears.", None),
    (WORKING + "Therefore, the result follows.", None),
    (WORKING + "We add them, so 4 + 3 = 7.", None),  # "so" inside a sentence is not its opening
    # a multiple-choice response that opens with its letter
    ("A. Because B is not valid", "A"),
    ("(C) since the other options fail", "C"),
    ("A farmer has 4 apples and buys 3 more.", "A farmer has 4 apples and buys 3 more."),  # short: taken whole
])
def test_a_long_response_without_a_marker_answers_only_in_its_concluding_sentence(text, expected):
    assert extract_answer(text) == expected


def test_a_concluding_sentence_scores_its_value():
    assert math_verifier(WORKING + "Therefore, the answer follows.\n\nIn conclusion, x = 4.", answer="4").score == 1.0
    assert math_verifier(WORKING + "Therefore, the number of apples is 5.", answer="4").score == 0.0
    assert math_verifier(WORKING + "Therefore, the number of apples is", answer="4").status == "no_answer"
