"""rewards/compare.py in detail: exact values and their size guards, the rounding rule, the structural
comparison of answer trees (intervals, |z| ranges, matrices, percentages, equations, inequalities, sets)."""

from fractions import Fraction

import pytest

from rewards import math_equal, math_verifier
from rewards.compare import (
    MAX_BIG_OPERATOR_WORK,
    MAX_RESULT_BITS,
    MAX_SET_ITEMS,
    TooLarge,
    canonical,
    check_binom_size,
    decimal_places,
    equivalent,
    exact_scalar_equal,
    exact_value,
    is_scalar,
    rationals_match,
    sample_points,
)
from rewards.latex import parse_answer


def value(text: str) -> Fraction | None:
    return exact_value(parse_answer(text))


@pytest.mark.parametrize("text,expected", [
    ("-3/4", Fraction(-3, 4)), ("2+3\\cdot 4", Fraction(14)), ("2^{-2}", Fraction(1, 4)), ("(-2)^3", Fraction(-8)),
    ("0^0", Fraction(1)), ("12.5\\%", Fraction(1, 8)), ("5!", Fraction(120)), ("0!", Fraction(1)), ("1!", Fraction(1)),
    ("\\binom{5}{2}", Fraction(10)), ("\\binom{0}{0}", Fraction(1)),
    ("\\binom{5}{0}", Fraction(1)), ("\\binom{5}{5}", Fraction(1)),
    ("\\binom{5}{7}", Fraction(0)), ("\\binom{5}{-1}", Fraction(0)), ("\\binom{2}{-400}", Fraction(0)),
    ("\\sum_{k=1}^{4} k^2", Fraction(30)), ("\\prod_{k=1}^{4} k", Fraction(24)), ("\\sum_{k=2}^{2} k", Fraction(2)),
    ("\\sum_{k=3}^{1} k", Fraction(0)), ("\\prod_{k=3}^{1} k", Fraction(1)),  # empty ranges: the sum's and product's units
    ("\\sum_{k=1}^{3} \\frac{1}{k}", Fraction(11, 6)),
    ("\\max(4, 6)", Fraction(6)), ("\\min(4, 6)", Fraction(4)), ("\\max(\\frac{1}{2}, \\frac{1}{3})", Fraction(1, 2)),
    ("\\gcd(12, -18)", Fraction(6)), ("\\operatorname{lcm}(4, 6)", Fraction(12)), ("\\gcd(0, 0)", Fraction(0)),
    ("1^{10^{9}}", Fraction(1)), ("(-1)^{10^{9}+1}", Fraction(-1)), ("0^{10^{9}}", Fraction(0)),  # no size to guard
])
def test_exact_values(text, expected):
    assert value(text) == expected


@pytest.mark.parametrize("text", [
    "x+1", "x\\%", "\\sqrt{2}", "\\pi", "2^{1/2}", "0^{-1}", "\\frac{1}{0}", "(-1)!", "(1/2)!", "\\binom{1/2}{1}",
    "\\binom{x}{2}",
    "\\sum_{k=1}^{n} k", "\\sum_{k=1}^{3} x", "\\sum_{k=1}^{3} \\sqrt{k}",
    "\\max(x, 1)", "\\gcd(1.5, 3)", "\\operatorname{lcm}(4, \\sqrt{2})",
])
def test_no_exact_value_for_symbols_irrationals_and_undefined_values(text):
    assert value(text) is None


@pytest.mark.parametrize("text", ["2^{5000}", "(3/2)^{5000}", "301!", "\\binom{10^{9}}{10^{5}}", "\\binom{-400}{2}",
                                  "2^{3000}\\cdot 2^{3000}", "2^{3000}+2^{4000}\\cdot 2^{100}"])
def test_numbers_past_the_size_guard_are_refused(text):
    with pytest.raises(TooLarge):
        value(text)


def test_the_size_guards_name_themselves():
    with pytest.raises(TooLarge, match="power too large"):
        value("2^{5000}")
    with pytest.raises(TooLarge, match="factorial too large"):
        value("301!")
    with pytest.raises(TooLarge, match="^lcm too large$"):
        exact_value(("fn", "lcm", (("num", Fraction(2**4095), None), ("num", Fraction(1), None))))


def test_an_lcm_is_refused_past_the_bound_on_its_arguments_bits():
    """lcm <= the product of its arguments: their bit lengths, summed, bound the result's."""
    within = ("fn", "lcm", (("num", Fraction(2 ** (MAX_RESULT_BITS - 2)), None), ("num", Fraction(1), None)))
    assert exact_value(within) == 2 ** (MAX_RESULT_BITS - 2)  # 4095 + 1 bits: at the bound
    with pytest.raises(TooLarge):
        exact_value(("fn", "lcm", (("num", Fraction(2 ** (MAX_RESULT_BITS - 1)), None), ("num", Fraction(1), None))))


def test_the_size_guard_bounds():
    # a power is refused when exponent x the base's bits passes the bound (2 is 2 bits)
    assert value(f"2^{{{MAX_RESULT_BITS // 2}}}") == 2 ** (MAX_RESULT_BITS // 2)
    with pytest.raises(TooLarge):
        value(f"2^{{{MAX_RESULT_BITS // 2 + 1}}}")
    with pytest.raises(TooLarge):
        value(f"(1/2)^{{{MAX_RESULT_BITS // 2 + 1}}}")  # the denominator's bits count too
    assert value("300!") > 0
    assert value("\\binom{1000}{2}") == 499500
    check_binom_size(10**9, 2)
    check_binom_size(-300, 5)  # gamma-valued arguments within the factorial bound
    check_binom_size(10**9, 0)
    check_binom_size(10**9, 10**9)
    check_binom_size(10**9, 10**9 - 2)  # the smaller side counts: binom(n, n - 2) = binom(n, 2)
    assert value("\\binom{10^{9}}{0}") == 1 and value("\\binom{10^{9}}{10^{9}-2}") == 499999999500000000
    check_binom_size(2**31, 128)  # 128 x 32 bits: exactly the bound
    with pytest.raises(TooLarge, match="binomial too large"):
        check_binom_size(2**31, 129)
    with pytest.raises(TooLarge, match="binomial too large"):
        check_binom_size(10**9, 10**5)
    check_binom_size(Fraction(1, 2), 300)
    with pytest.raises(TooLarge, match="binomial too large"):
        check_binom_size(Fraction(1, 2), 301)
    # products and sums are guarded as they grow: 2^4095 has 4096 bits, the bound; 2^4096 passes it
    assert value("2^{2000}\\cdot 2^{2000}\\cdot 2^{95}") == 2**4095
    assert value("(1/2)^{2000}\\cdot (1/2)^{2000}\\cdot (1/2)^{95}") == Fraction(1, 2**4095)
    for past in ("2^{2000}\\cdot 2^{2000}\\cdot 2^{96}", "(1/2)^{2000}\\cdot (1/2)^{2000}\\cdot (1/2)^{96}",
                 "2^{2000}\\cdot 2^{2000}\\cdot 2^{2000}\\cdot 3"):
        with pytest.raises(TooLarge, match="intermediate value too large"):
            value(past)
    # a sum whose work (terms x body size) passes the bound has no exact value here; the worker decides it
    assert value("\\sum_{k=1}^{100000} k") is None
    assert value("\\sum_{k=1}^{10} \\sum_{j=1}^{2} j") is None  # nested big operators: not evaluated here
    assert value("\\sum_{k=1}^{10} \\prod_{j=1}^{2} j") is None and value("\\prod_{k=1}^{3} \\sum_{j=1}^{2} j") is None
    assert value("\\sum_{k=\\frac{1}{2}}^{3} k") is None and value("\\sum_{k=1}^{7/2} k") is None  # bounds must be integers
    # the work bound: terms x the body's size, at most MAX_BIG_OPERATOR_WORK
    body = ("add", (("sym", "k"),) * 44)  # k + k + ... (44 times): 625 characters, 32 of them make the bound exactly
    size = len(repr(body))
    terms = MAX_BIG_OPERATOR_WORK // size

    def big_sum(low: int, high: int) -> tuple:
        return ("fn", "sum", (body, ("sym", "k"), ("num", Fraction(low), None), ("num", Fraction(high), None)))
    assert terms * size == MAX_BIG_OPERATOR_WORK
    assert exact_value(big_sum(1, terms)) == 44 * terms * (terms + 1) // 2
    assert exact_value(big_sum(1, terms + 1)) is None
    assert exact_value(big_sum(5, 4 + terms)) is not None and exact_value(big_sum(5, 5 + terms)) is None
    huge_body = ("add", (("sym", "k"),) * 2000)  # larger than the bound alone: an empty range is still 0
    assert exact_value(("fn", "sum", (huge_body, ("sym", "k"), ("num", Fraction(3), None), ("num", Fraction(1), None)))) == 0


def test_decimal_places_and_the_rounding_rule():
    assert [decimal_places(parse_answer(t)) for t in ("0.250", "-1.5", "--2.25", "3", "1/2")] == [3, 1, 2, None, None]
    third = Fraction(1, 3)
    # a prediction written to >= 2 places that is the gold rounded
    assert rationals_match(Fraction(33, 100), third, 2, None)
    assert not rationals_match(Fraction(33, 100), third, 3, None)  # 0.330 claims a third place
    assert not rationals_match(Fraction(3, 10), third, 1, None)  # one place is too coarse
    assert not rationals_match(Fraction(1, 100), Fraction(1, 150), 2, None)  # |0.01| * 10^2 < 10: too few digits
    assert not rationals_match(Fraction(9, 100), Fraction(904, 10000), 2, None)  # 0.09: one significant digit
    assert rationals_match(Fraction(10, 100), Fraction(1, 10) + Fraction(1, 300), 2, None)  # 0.10: two digits shown
    assert rationals_match(Fraction(-33, 100), -third, 2, None)
    # a decimal gold is never the rounding of a prediction ...
    assert not rationals_match(third, Fraction(33, 100), None, 2)
    # ... unless it is computed to many places and the prediction is exact
    exact = Fraction(412310563, 10**8)
    assert rationals_match(exact, Fraction(4123106, 10**6), None, 6)
    assert not rationals_match(exact, Fraction(4123106, 10**6), 8, 6)  # both written as decimals
    assert not rationals_match(exact, Fraction(412311, 10**5), None, 5)  # a gold of 5 places is taken as written
    assert not rationals_match(Fraction(41231055, 10**7), Fraction(4123106, 10**6), None, 6)  # half a unit off
    assert rationals_match(Fraction(7, 2), Fraction(7, 2), None, None)


def test_canonical_orders_operands_and_reads_numbers_by_value():
    assert canonical(parse_answer("x + 2y")) == canonical(parse_answer("2y + x"))
    assert canonical(parse_answer("\\{3, 1\\}")) == canonical(parse_answer("\\{1, 3\\}"))
    assert canonical(parse_answer("0.5x")) == canonical(parse_answer("0.50x"))  # the places written do not count
    assert canonical(parse_answer("(3, 1)")) != canonical(parse_answer("(1, 3)"))  # tuples keep their order
    assert canonical(parse_answer("x - y")) != canonical(parse_answer("y - x"))
    for inside in ("\\sin(0.5x)", "0.5x < 1", "[0.5, 1]", "(0.5, 1)", "-0.5x", "x^{0.5}", "\\begin{pmatrix}0.5\\end{pmatrix}"):
        assert canonical(parse_answer(inside)) == canonical(parse_answer(inside.replace("0.5", "0.50"))), inside


@pytest.mark.parametrize("first,second", [
    ("x < 1", "y < 1"), ("x < 1", "x < 2"), ("x < 1", "x \\le 1"), ("[1, 2)", "(1, 2]"), ("[1, 2)", "[1, 3)"),
    ("[1, 2)", "[0, 2)"), ("[1, 2)", "[1, 2]"), ("\\sin(x)", "\\cos(x)"), ("\\sin(x)", "\\sin(y)"),
    ("\\begin{pmatrix}1&2\\end{pmatrix}", "\\begin{pmatrix}1&3\\end{pmatrix}"), ("(1, 2)", "(1, 3)"),
    ("1 < x < 2", "1 < x < 3"), ("[1,2] \\cup [3,4]", "[1,2] \\cup [3,5]"), ("5 m", "5 cm"), ("5 m", "6 m"),
    ("x = 1", "x = 2"), ("-x", "x"), ("x^2", "2^x"), ("x/2", "2/x"), ("50\\%", "50"), ("\\pi", "e"),
    ("\\text{yes}", "\\text{no}"),
])
def test_canonical_tells_apart_what_differs(first, second):
    assert canonical(parse_answer(first)) != canonical(parse_answer(second))


@pytest.mark.parametrize("pred,gold,verdict", [
    ("0.5", "1/2", True), ("x + y", "y + x", True), ("3", "4", False),
    # a gold computed to 6 places is the rounding of an exact prediction; one of 4 places is taken as written
    ("\\frac{41231056}{10^{7}}", "4.123106", True), ("\\frac{41231}{10^{4}}", "4.1231", True),
    ("\\frac{412312}{10^{5}}", "4.1231", False),
    ("x+1", "1+x", True), ("\\sqrt{2}", "2^{1/2}", None),  # undecided here: the worker's sympy decides
    ("(1, 2)", "3", False), ("\\text{yes}", "x", False), ("x", "\\{1\\}", False),
])
def test_the_in_process_scalar_test(pred, gold, verdict):
    assert exact_scalar_equal(parse_answer(pred), parse_answer(gold)) is verdict


@pytest.mark.parametrize("text,scalar", [
    ("x^2 + 1", True), ("-\\frac{x}{2}", True), ("50\\%", True), ("\\sin(x)", True), ("\\pi", True),
    ("(1, 2)", False), ("2(1,2)", False), ("x + (1, 2)", False), ("(1, 2)\\%", False),
    ("\\sqrt{\\{1,2\\}}", False), ("\\frac{x=1}{2}", False), ("-(1,2)", False),
    ("(1,2)^2", False), ("\\sum_{k=1}^{n} k", False), ("\\text{yes}", False), ("x = 1", False),
])
def test_is_scalar(text, scalar):
    assert is_scalar(parse_answer(text)) is scalar


def test_sample_points_give_each_variable_a_distinct_value_at_every_point():
    points = sample_points(["x", "y", "z"])
    assert len(points) == 3 and len({tuple(p.values()) for p in points}) == 3
    for point in points:
        assert set(point) == {"x", "y", "z"} and len(set(point.values())) == 3
        assert all(v not in (0, 1, -1) and v.denominator != 1 for v in point.values())


@pytest.mark.parametrize("pred,gold,equal", [
    # a one-variable inequality is its solution interval, either way round
    ("x > 3", "(3, \\infty)", True), ("x \\ge 3", "[3, \\infty)", True), ("x < 3", "(-\\infty, 3)", True),
    ("x \\le 3", "(-\\infty, 3]", True), ("3 < x", "(3, \\infty)", True), ("3 \\le x", "[3, \\infty)", True),
    ("x \\ge 3", "(3, \\infty)", False), ("x > 3", "(-\\infty, 3)", False),
    # only a variable against a bound that is not a bare variable: x < y and 1 < 2 are no intervals
    ("x < y", "(-\\infty, y)", False), ("y < x", "(y, \\infty)", False), ("1 < 2", "(-\\infty, 2)", False),
    ("1 < 2", "(1, \\infty)", False), ("1 < \\sin(x) < 2", "(-2, -1) \\cup (1, 2)", False),
    # x != a is the line without a, either way round
    ("x \\ne 2", "(-\\infty, 2) \\cup (2, \\infty)", True), ("(-\\infty, 0) \\cup (0, \\infty)", "x \\neq 0", True),
    ("2 \\ne x", "(-\\infty, 2) \\cup (2, \\infty)", True), ("x \\ne 2", "(-\\infty, 2] \\cup (2, \\infty)", False),
    ("x \\ne 2", "(-\\infty, 3) \\cup (3, \\infty)", False), ("x \\ne y", "(-\\infty, y) \\cup (y, \\infty)", False),
    ("1 < x \\le 2", "(1, 2]", True), ("1 \\le x < 2", "[1, 2)", True), ("1 < x < 2", "[1, 2)", False),
    ("0 < f(x) < 1", "(0, 1)", True), ("0 < 2x < 1", "(0, 1)", False), ("a < x < b", "(a, b)", True),
    ("a < f(x) < 1", "(a, 1)", False), ("0 < f(x) < b", "(0, b)", False),  # a named quantity: between numbers only
    # |z| between bounds: two intervals, or one when 0 is allowed
    ("1 \\le |z| \\le 2", "[-2, -1] \\cup [1, 2]", True), ("1 < |z| < 2", "(-2, -1) \\cup (1, 2)", True),
    ("1 \\le |z| < 2", "(-2, -1] \\cup [1, 2)", True), ("1 \\le |z| < 2", "[-2, -1] \\cup [1, 2)", False),
    ("0 < |z| < 1", "(-1, 0) \\cup (0, 1)", True), ("0 \\le |z| < 1", "(-1, 1)", True),
    ("0 \\le |z| \\le 1", "[-1, 1]", True), ("0 \\le |z| \\le 1", "(-1, 1)", False),
    ("-1 < |z| < 2", "(-2, 2)", True), ("-1 < |z| \\le 2", "[-2, 2]", True), ("-1 < |z| < 2", "(-2, 1) \\cup (1, 2)", False),
    ("2 < |z| < 1", "(-1, -2) \\cup (2, 1)", False), ("-2 < |z| < -1", "(1, 2)", False), ("a < |z| < 2", "(-2, 2)", False),
    # an open interval is a pair; a closed one is not
    ("(1, 2)", "(1, 2)", True), ("(1, 2)", "[1, 2]", False), ("(1, 2, 3)", "(1, 2)", False), ("[1, 2)", "(1, 2)", False),
    # sets and lists: any order, duplicates ignored; a union against a set of the same parts
    ("\\{1, 2, 2\\}", "\\{2, 1\\}", True), ("\\{1, 2\\}", "\\{1, 3\\}", False), ("1, 2, 3", "3, 2, 1", True),
    ("x, 2x", "2x, x", True), ("1, 2", "1, 2, 3", False),
    # matrices: sums, products, scalar multiples and negations are their values
    ("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}+\\begin{pmatrix}5&6\\\\7&8\\end{pmatrix}",
     "\\begin{pmatrix}6&8\\\\10&12\\end{pmatrix}", True),
    ("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}\\begin{pmatrix}5&6\\\\7&8\\end{pmatrix}",
     "\\begin{pmatrix}19&22\\\\43&50\\end{pmatrix}", True),
    ("\\begin{pmatrix}5&6\\\\7&8\\end{pmatrix}\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}",
     "\\begin{pmatrix}19&22\\\\43&50\\end{pmatrix}", False),  # not commutative
    ("\\begin{pmatrix}1&2\\end{pmatrix}\\begin{pmatrix}5&6\\\\7&8\\end{pmatrix}", "\\begin{pmatrix}19&22\\end{pmatrix}", True),
    ("2\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\begin{pmatrix}2&4\\\\6&8\\end{pmatrix}", True),
    ("-\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\begin{pmatrix}-1&-2\\\\-3&-4\\end{pmatrix}", True),
    ("x\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\begin{pmatrix}x&2x\\\\3x&4x\\end{pmatrix}", True),
    ("\\begin{pmatrix}1&2\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", False),  # a row is not a column
    ("\\begin{pmatrix}1&2\\end{pmatrix}+\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}2&4\\end{pmatrix}", False),
    # percentages: a gold of 28% takes 0.28 and 28; a predicted % means a fraction, or a bare gold >= 1 without its sign
    ("28", "28\\%", True), ("0.28", "28\\%", True), ("28\\%", "28\\%", True), ("2.8", "28\\%", False),
    ("25\\%", "25", True), ("25\\%", "0.25", True), ("0.75\\%", "0.75", False), ("25\\%", "0.025", False),
    ("-25\\%", "-25", True), ("\\frac{100}{4}\\%", "25", False),
    ("28\\%", "0.28\\%", False), ("\\frac{28}{1}\\%", "28\\%", True),  # both with the sign: the numbers before it
    ("1\\%", "1", True), ("-1\\%", "-1", True), ("1\\%", "0.01", True),  # a bare gold of size 1 may have lost its sign
    # equations and inequalities
    ("x = 3", "3", True), ("AB = 4", "4", True), ("4", "AB = 4", True), ("x + 1 = 4", "3", False),
    ("2x = 6", "x = 3", False), ("x = 3", "2x = 6", False), ("x = 3", "x = 3", True), ("3 = x", "x = 3", True),
    ("2x+4y-3=0", "y=-x/2+3/4", True), ("x + y = 1", "x - y = 1", False), ("1 = 2", "2 = 4", False),
    ("x = x", "y = 2x", False), ("y = \\sqrt{x}", "y = x^2", False),
    # the difference vanishes at a sample point (x = 37/101) and is twice the gold's at the others
    ("2x + 2y = 74/101 + 2y", "x + y = 37/101 + y", True),
    # sides only sympy decides go on to it: they were scored 0 in-process
    ("x < \\log_{2}(\\pi^{2})", "\\frac{\\ln(\\pi^2)}{\\ln 2} > x", True),
    ("x < e^{\\sqrt{3} - 6}", "\\exp(\\sqrt{3} - 6) > x", True),
    ("x < \\sqrt{2}", "\\sqrt{3} > x", False), ("x < e^{\\sqrt{3} - 6}", "\\exp(\\sqrt{3} - 5) > x", False),
    ("x < 1", "-x > -1", True), ("2x < 2", "x < 1", True), ("x < 1", "2x < 2", True), ("-2x < -2", "x < 1", False),
    ("x \\ne 1", "2x \\ne 2", True), ("x \\ne 1", "-x \\ne -1", True), ("x < 1", "x \\le 1", False),
    ("1 < 2 < 3", "1 < 2 < 3", True), ("1 < x < 3", "1 < x \\le 3", False),
    # values given to names in alphabetical order answer an ordered tuple, either way round; in another order, or
    # with a name twice, they do not (which order was meant is a guess)
    ("x = 3, y = -1", "(3, -1)", True), ("(3, -1)", "x = 3, y = -1", True), ("a=1, b=2, c=3", "(1, 2, 3)", True),
    ("\\rho = 2, \\theta = \\frac{\\pi}{3}", "\\left(2, \\frac{\\pi}{3}\\right)", True),
    ("y = -1, x = 3", "(3, -1)", False), ("x = -1, y = 3", "(3, -1)", False), ("x = 3, x = 4", "(3, 4)", False),
    ("x = 3, y = -1, z = 0", "(3, -1)", False), ("x = 3, y + 1 = 0", "(3, -1)", False),
    ("x = 3, y = -1", "x = 3, y = -1", True), ("y = -1, x = 3", "x = 3, y = -1", True),
    # units: compared when both are given
    ("5 m", "5 cm", False), ("5 m", "5", True), ("5", "5 m", True), ("5 m", "5 m", True),
    # a relation against anything but the same relation differs; chains compare link by link
    ("x < y", "x \\le y", False), ("x < y", "x + 1", False), ("x + 1", "x < y", False),
    ("0 < 2x < 1", "0 < x + x < 1", True), ("0 < 2x < 1", "0 < 3x < 1", False), ("0 < 2x < 1 < y", "0 < 2x < 1", False),
    ("0 < 2x < 1", "2x + 1", False), ("2x + 1", "0 < 2x < 1", False), ("0 < 2x \\le 1", "0 < 2x < 1", False),
    # text against text
    ("\\text{yes}", "\\text{yes}", True), ("\\text{yes}", "\\text{no}", False), ("\\text{yes}", "\\text{Yes}", True),
])
def test_structural_equivalence(pred, gold, equal):
    assert math_equal(pred, gold) is equal


@pytest.mark.parametrize("pred, gold", [("1, 2", "(1, 2)"), ("x = 3, y + 1 = 0", "(3, -1)"), ("a = 3, |y| = 1", "(3, 1)"),
                                        ("x = 3", "(3, 4)")])
def test_a_list_that_is_not_values_given_to_names_is_no_tuple_and_no_error(pred, gold):
    result = math_verifier(f"\\boxed{{{pred}}}", answer=gold)
    assert (result.score, result.status) == (0.0, "ok")


def test_equivalent_leaves_the_leaves_to_the_scalar_test():
    """equivalent walks the containers and hands each pair of leaves to the scalar test it is given."""
    seen = []

    def undecided(pred, gold):
        seen.append((pred, gold))
        return None

    assert equivalent(parse_answer("(a, b)"), parse_answer("(c, d)"), undecided) is None
    assert seen == [(("sym", "a"), ("sym", "c")), (("sym", "b"), ("sym", "d"))]
    assert equivalent(parse_answer("\\{a, b\\}"), parse_answer("\\{c, d\\}"), lambda p, g: p[1] == "a" and g[1] == "d"
                      or p[1] == "b" and g[1] == "c") is True  # a perfect matching across the order
    assert equivalent(parse_answer("\\{a, b\\}"), parse_answer("\\{c, d\\}"),
                      lambda p, g: p[1] == "a" or None) is None  # b matches nothing for sure: undecided
    assert equivalent(parse_answer("\\{a, b\\}"), parse_answer("\\{c, d\\}"), lambda p, g: p[1] == "a") is False


def test_sets_up_to_the_size_bound_are_matched_and_larger_ones_refused():
    def numbers(items) -> tuple:
        return parse_answer("\\{" + ", ".join(map(str, items)) + "\\}")

    bound = range(1, MAX_SET_ITEMS + 1)
    assert equivalent(numbers(bound), numbers(reversed(bound)), exact_scalar_equal) is True
    past = range(1, MAX_SET_ITEMS + 2)
    with pytest.raises(TooLarge, match="set too large"):
        equivalent(numbers(past), numbers(reversed(past)), exact_scalar_equal)
    assert equivalent(numbers(past), numbers(bound), exact_scalar_equal) is False  # sizes differ: no matching needed
