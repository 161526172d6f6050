import json
from pathlib import Path

import pytest

from rewards import extract_answer, math_equal, math_verifier
from rewards.latex import ParseError, parse_answer

CASES = Path(__file__).resolve().parents[1] / "bench" / "data" / "verifier_cases.jsonl"


@pytest.mark.parametrize("pred,gold,equal", [
    ("\\boxed{\\frac{1}{2}}", "0.5", True),
    ("7,425,000", "7425000", True),
    ("1 1/4", "\\frac{5}{4}", True),
    ("1\\frac{1}{4}", "5/4", True),
    ("1.5e3", "1500", True),
    ("28\\%", "0.28", True),
    ("0.28", "28", False),
    ("2^{-99}", "2^{-98}", False),  # exact, not float: tiny magnitudes stay distinct
    ("5 m", "5 cm", False),  # units are compared, not stripped
    ("5 \\text{ cm}", "5", True),
    ("[2,5)", "[2,5]", False),
    ("x>3", "(3,\\infty)", True),
    ("3+2x", "2x+3", True),
    ("x=3", "3", True),
    ("1 \\pm \\sqrt{2}", "1+\\sqrt2, 1-\\sqrt 2", True),
    ("(1,2,3)", "(3,2,1)", False),
    ("\\{1,2,3\\}", "\\{3,2,1\\}", True),
    ("\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}", "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", True),
    ("x^2-1", "(x-1)(x+1)", True),
    ("\\sqrt{12}", "3\\sqrt{2}", False),
    ("1.414", "\\sqrt{2}", True),
    ("\\infty", "-\\infty", False),
    ("3 or 4", "3", False),  # hedged answers fail
    ("12 5", "60", False),  # two numbers side by side are not a product
    ("2.5.3", "0.75", False),
    ("0175", "175", True),  # plain integers take a fast path; it must agree with the parser
    ("+5", "5", True),
    ("-0", "0", True),
    ("-7", "7", False),
    ("123456789012345678901234567890", "123456789012345678901234567891", False),
    ("\\$1,\\!000", "1000", True),  # MATH's thousands separator
    ("11,\\! 111,\\! 111,\\! 100", "11111111100", True),
    ("$\\frac{1}{3},$", "1/3", True),  # sentence punctuation after the answer
    ("x \\in (2,12) \\cup (12,102)", "(2, 12) \\cup (12, 102)", True),  # 12,102 in brackets is not 12102
    ("{-2021, 2021}", "\\pm 2021", True),  # a set in bare braces
    ("125\\textnormal{ miles}", "125 miles", True),
    ("28", "28\\%", True),  # the gold's percent sign may be left off
    ("4 4/9\\%", "40/900", True),
    ("4 4/9\\%", "40/9", False),  # the model's percent sign is binding
    ("either $\\boxed{4}$ or $\\boxed{6}$ depending on the reading", "6", False),
    ("the integers are \\boxed{-2} and \\boxed{1}.", "1,-2", True),
    ("so $m \\in [\\sqrt{2}, +\\infty)$", "m\\geq\\sqrt2", True),
    # relations equal up to moving terms and a constant factor (positive for inequalities)
    ("-x>-1", "x<1", True),
    ("-x<-1", "x<1", False),
    ("y=-\\frac12x+\\frac34", "2x+4y-3=0", True),
    ("-34x-45y+20z-100=0", "34x+45y-20z+100=0", True),
    ("x^2/16 + y^2/12 = 1/4", "x^2/4 + y^2/3 = 1", True),
    ("y=2x+2", "y=2x+1", False),
    ("2x=6", "x=3", False),  # a solved value is answered only by the value
    ("x^2=4", "x=2", False),
    ("$z = 3+3 = 2$", "z = 1 + 1 = 2", True),  # an equality chain states first = last (math-verify's reading)
])
def test_math_equal_on_the_hard_cases(pred, gold, equal):
    assert math_equal(pred, gold) is equal


def test_labelled_eval_set_has_no_false_positives():
    cases = [json.loads(line) for line in CASES.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(cases) >= 300
    assert 0.4 <= sum(c["equal"] for c in cases) / len(cases) <= 0.6  # both labels balanced
    wrong = [c for c in cases if math_equal(c["pred"], c["gold"]) != c["equal"]]
    assert not [c for c in wrong if not c["equal"]], "false positives"
    assert len(wrong) <= 0.02 * len(cases), wrong


@pytest.mark.parametrize("text,answer", [
    ("first \\boxed{5}, then correcting: \\boxed{3}.", "3"),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),
    ("so \\fbox{7} it is", "7"),
    ("<think>2+2</think><answer> 4 </answer>", "4"),
    ("Final Answer: The final answer is $28 \\%$. I hope it is correct.", "$28 \\%$"),
    ("blah blah\nAnswer: 12", "12"),
    ("Natalia sold 24 clips.\n#### 72", "72"),
    ("(2,4)", "(2,4)"),
    ("I believe it is either $\\boxed{4}$ or $\\boxed{6}$.", "4 or 6"),  # a hedge across boxes: not a value
    ("\\[ \\boxed{-2} \\quad \\text{and} \\quad \\boxed{1}. \\]", "-2, 1"),  # boxes that form one answer
    ("so \\boxed{200}. Wait, actually it is \\boxed{255}", "255"),  # a revision: the last box wins
    ("\\boxed{200}. So $10,455 in all. Final Answer: The final answer is $10,455$.", "$10,455$"),
    ("so \\boxed{5}. This is my final answer.", "5"),
    ("Final Answer: The volume of $ABCDEFGH$ is 120. I hope it is correct.", "120"),
    ("---\n\nFinal Answer: **73**", "73"),
    ("Answer $ 9 $", "$ 9 $"),
    ("Therefore $x \\geq 5$ is the solution.", "x \\geq 5"),
    ("the number is not 10", "the number is not 10"),
])
def test_extract_answer_follows_the_spec_order(text, answer):
    assert extract_answer(text) == answer


def test_a_number_only_in_the_working_is_not_an_answer():
    working = "We add 5 and 7 to get 12 apples. Then we remove 4 and share the rest among the children fairly."
    assert extract_answer(working) is None
    assert math_verifier(working, answer="12").status == "no_answer"


def test_unbalanced_box_falls_back_without_raising():
    assert extract_answer("\\boxed{3") == "\\boxed{3"  # short text taken whole, then fails to parse
    assert math_verifier("\\boxed{3", answer="3").score == 0.0


def test_verifier_statuses_and_details():
    ok = math_verifier("so \\boxed{4}", answer="4")
    assert (ok.score, ok.status, ok.details["method"]) == (1.0, "ok", "string")
    assert math_verifier("so \\boxed{0.5}", answer="1/2").details["method"] == "exact"
    assert math_verifier("so \\boxed{x^2-1}", answer="(x-1)(x+1)").details["method"] == "symbolic"
    wrong = math_verifier("so \\boxed{5}", answer="4")
    assert (wrong.score, wrong.status) == (0.0, "ok")
    assert math_verifier("so \\boxed{4}", answer=4).score == 1.0  # numeric gold
    assert math_verifier("so \\boxed{4}", answer="The answer is \\boxed{4}").score == 1.0  # boxed gold solution
    assert math_verifier("so \\boxed{4}", answer=None).status == "error"
    assert math_verifier(None, answer="4").status == "error"


def test_parser_refuses_python_and_runaway_input():
    for hostile in ("__import__('os').system('echo hi')", "lambda: 0", "{" * 5000 + "1" + "}" * 5000):
        with pytest.raises(ParseError):
            parse_answer(hostile)
