"""Regressions from a review of answer extraction: quadratic whitespace runs, blank boxes and tags echoed
from the prompt, common phrasings, and reasoning-gym's tags-first order."""

import time

import pytest

from rewards import extract_answer, math_verifier
from rewards.extract import SHORT_ANSWER_CHARS, SHORT_STATEMENT_CHARS, tagged_answer

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
    ("So n = 3 + 4 = $7$ apples", "7"),  # words after the last "=" only: the chain still ends in its value
    ("The roots are 2 and 3", "2 and 3"),  # an "and" after the verb is part of the value
    ("We get $n \\text{ is } 2$ here", "n \\text{ is } 2"),  # an "is" inside the maths is not the sentence's verb
    # a closing remark in words, the last bracket only: "(in m)" is two words, "f(x)" a value
    ("The answer is 12 (in m).", "12"),
    ("The answer is $f(x) = 2x$ (in cm).", "$f(x) = 2x$"),
    # a sentence around one plain number is that number; a number glued to a word is no plain number
    ("The answer is that she waited 3 hours.", "3"),
    ("The answer is the 3rd one.", "the 3rd one"),
    ("The total is 12\n####", None),  # GSM8K's marker with nothing after it
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
    (WORKING + "Thus the total is 12!", "12"),
    # one long line, and working on lines without full stops: the sentence starts after the last line break
    ("Therefore, after adding the two numbers together very carefully, the final total number is 4.", "4"),
    ("3 + 1 = 4\n4 - 0 = 4\nTherefore x is 4.", "4"),
    # two conclusions in the sentence: the last one's value
    ("We solve the system.\nThus $x = 6$ So, the pair is (6, 3).", "(6, 3)"),
    # cut off mid-sentence, no conclusion, or a conclusion that is not the last sentence: working, no answer
    (WORKING + "Therefore, x is 4", None),
    (WORKING + "Therefore, x is 4. Now check the second basket.", None),
    (WORKING + "The number of apples is 4.", None),
    (WORKING + "Therefore, we have 4 apples and 3 pears.", None),
    (WORKING + "Therefore, the result follows.", None),
    (WORKING + "Therefore the length is 3 m to 4 m.", None),  # words around two values: no one value
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


@pytest.mark.parametrize("text, expected", [
    ("So the answers are \\boxed{(3,3)} for part (a) and \\boxed{(1,1)} for part (b).", "(3,3), (1,1)"),
    ("It is \\boxed{4}, so \\boxed{5}.", "5"),  # no "and": the later box revises the earlier
    ("It is \\boxed{4} and not \\boxed{5}.", "5"),  # a revision's word, even with "and"
    ("The solutions are \\boxed{4}, \\boxed{5}.", "4, 5"),  # only commas and blanks between: a list
    ("\\boxed{4}. And \\boxed{5}.", "5"),  # an earlier sentence's box is revised, "and" or not
    ("\\boxed{4}\\boxed{5}", "4, 5"),  # side by side
    ("\\boxed{4} and \\boxed{\\boxed{5}}", "4, 5"),  # a box around a box is that box
    ("so the answer is \\boxed 5", "5"),  # \\boxed without braces takes one token
    ("Final Answer: \\boxed{4}", "4"),  # the marker before the box is not a restatement after it
    ("\\boxed{4} is the answer because the answer is 2 + 2.", "4"),  # only a "Final Answer" after the box restates
])
def test_a_responses_boxes_in_one_sentence_are_a_list_only_when_joined_by_and(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("$x = \\boxed{3}$ or $x = \\boxed{-3}$", "3, -3"),
    ("(a) \\boxed{3} for part (a); (b) \\boxed{4}.", "3, 4"),
])
def test_a_references_boxes_in_its_final_sentence_are_all_its_answers(text, expected):
    assert extract_answer(text, reference=True) == expected
    assert extract_answer(text) != expected  # in a response, "or" is a hedge and a list needs "and"
    assert math_verifier(f"\\boxed{{{expected}}}", answer=text).score == 1.0


@pytest.mark.parametrize("text, expected", [
    ("Final Answer:\n$$\n\\frac{1}{2}\n$$", "$$\n\\frac{1}{2}\n$$"),
    ("Answer\n\\[\n9\n\\]", "\\[\n9\n\\]"),
    ("The final answer is $$\n12\n$$", "$$\n12\n$$"),
    ("Hence the area of the whole region is $$12$$ square units.", "12"),
    ('The final answer is "12".', "12"),  # quotes are punctuation
    ("The answer is 2X.", "2X"),  # the full stop only
    ("We get $$n \\text{ is } 2$$ here", "n \\text{ is } 2"),  # a display span inside a sentence
])
def test_a_stated_answer_in_display_maths_is_read_whole_across_its_lines(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    # one line, too long to be the answer itself, that hands over to one value at its end
    ("The matrix we get after multiplying both of the given matrices together is "
     "$\\begin{pmatrix}1&2\\end{pmatrix}$.", "\\begin{pmatrix}1&2\\end{pmatrix}"),
    ("Here is the value that I computed for the sum of all of the terms in the list: $\\frac{3}{4}$",
     "\\frac{3}{4}"),
    # several lines without a marker or a conclusion: working only
    ("We add.\nThe sum is $5$", None),
    ("x = 4\ny = 5", None),
    # nothing there
    ("  \n ", None),
    (None, None),
])
def test_a_response_without_a_marker_states_a_value_only_at_the_end_of_one_line(text, expected):
    assert extract_answer(text) == expected


def test_a_tagged_answer_prefers_its_box_and_anything_but_text_has_none():
    """tagged_answer is reasoning-gym's reader: it sees the tag's content before any box elsewhere."""
    assert tagged_answer("<answer>The answer is \\boxed{4}, not 5</answer>") == "4"
    assert tagged_answer(None) is None and tagged_answer("The answer is 4") is None


def test_the_length_bounds_of_a_bare_answer_and_a_one_line_statement_are_inclusive():
    bare = "+".join(["12"] * 40)[:SHORT_ANSWER_CHARS].rstrip("+")
    bare += "1" * (SHORT_ANSWER_CHARS - len(bare))
    assert len(bare) == SHORT_ANSWER_CHARS and extract_answer(bare) == bare
    assert extract_answer(bare + "1") is None  # longer: a value without a marker is working
    value = "$\\frac{3}{4}$"
    words, odd = divmod(SHORT_STATEMENT_CHARS - len("is ") - len(value), 2)
    statement = "a " * words + " " * odd + "is " + value  # "a a ... a is $v$": prose handing over to its value
    assert len(statement) == SHORT_STATEMENT_CHARS and extract_answer(statement) == "\\frac{3}{4}"
    assert extract_answer(statement.replace("is ", "is  ")) is None


def test_display_maths_closed_by_a_single_dollar_gets_a_verdict_not_an_error():
    assert math_verifier("So the answer is $$5$ apples", answer="5").status == "ok"
