"""rewards/latex.py's parser on its own: the trees it builds for the shapes answers take (the verifier's tests check
the verdicts built on them)."""

from fractions import Fraction

import pytest

from rewards import math_equal
from rewards.latex import ParseError, parse_answer


@pytest.mark.parametrize("answer, name", [
    ("x_1", "x_1"),
    ("x_{12}", "x_12"),
    ("a_{n}", "a_n"),
    ("x_i", "x_i"),  # i alone is the imaginary unit; as a subscript it is a name's part
    ("S_{MBCN}", "S_MBCN"),
    ("a_{12k}", "a_12k"),
    ("x_{1.5}", "x_3/2"),
])
def test_a_subscript_becomes_part_of_the_name(answer, name):
    assert parse_answer(answer) == ("sym", name)


def test_an_expression_subscript_is_named_by_its_canonical_form():
    assert parse_answer("F_{n-k-1}") == parse_answer("F_{n-1-k}") != parse_answer("F_{n-k}")
    assert parse_answer("F_{n-k-1}")[1].startswith("F_{(")
    assert math_equal("F_{n-k-1} + 1", "1 + F_{n-1-k}") and not math_equal("F_{n-k-1}", "F_{n-k}")


@pytest.mark.parametrize("answer, message", [
    ("x_{(1,2)}", "complex subscript"),
    ("5_2", "subscripted number"),
])
def test_subscripts_the_parser_cannot_name_are_refused(answer, message):
    with pytest.raises(ParseError, match=f"^{message}$"):
        parse_answer(answer)


def num(value):
    return ("num", Fraction(value), None)


def eq(name, value):
    return ("eq", ("sym", name), num(value))


PAIRS_57 = ("set", (("tuple", (num(5), num(2))), ("tuple", (num(7), num(2)))))


@pytest.mark.parametrize("answer, tree", [
    ("p=5,q=2;p=7,q=2", PAIRS_57),  # solutions separated by ';', the variables in the same order
    ("x_1=1,x_2=2;x_1=3,x_2=4", ("set", (("tuple", (num(1), num(2))), ("tuple", (num(3), num(4)))))),
    # otherwise a flat set of what was written
    ("p=5,q=2;q=7,p=2", ("set", (eq("p", 5), eq("q", 2), eq("q", 7), eq("p", 2)))),  # another order
    ("p=5,q=2;p=7", ("set", (eq("p", 5), eq("q", 2), eq("p", 7)))),  # another shape
    ("p=5;p=7", ("set", (eq("p", 5), eq("p", 7)))),  # one variable: no pairs
    ("p=5,p=2;p=7,p=3", ("set", (eq("p", 5), eq("p", 2), eq("p", 7), eq("p", 3)))),  # a variable twice
    ("1,2;3,4", ("set", (num(1), num(2), num(3), num(4)))),  # no variables
])
def test_semicolons_separate_solutions_only_when_each_names_the_same_variables(answer, tree):
    assert parse_answer(answer) == tree


PLUS_MINUS_1 = ("set", (num(1), ("neg", num(1))))
FIVE = ("add", (num(2), num(3)))


@pytest.mark.parametrize("answer, tree", [
    # inside a container each \pm value is the set of its values, and an item without one stays as it is
    ("(\\pm 1, 2+3)", ("tuple", (PLUS_MINUS_1, FIVE))),
    ("1:\\pm 1", ("ratio", (num(1), PLUS_MINUS_1))),
    ("\\{\\pm 1\\} \\cup \\{2+3\\}", ("union", (PLUS_MINUS_1, ("set", (FIVE,))))),
    ("\\begin{pmatrix} \\pm 1 & 2+3 \\end{pmatrix}", ("matrix", ((PLUS_MINUS_1, FIVE),))),
    ("x \\in [\\pm 1, 2+3]", ("interval", True, PLUS_MINUS_1, FIVE, True)),
    ("x = \\pm 1", ("eq", ("sym", "x"), PLUS_MINUS_1)),
    ("x < \\pm 1", ("rel", "<", ("sym", "x"), PLUS_MINUS_1)),
    ("2+3 < \\pm 1", ("rel", "<", FIVE, PLUS_MINUS_1)),
    ("1 < \\pm 1 < 2+3", ("chain", (("rel", "<", num(1), PLUS_MINUS_1), ("rel", "<", PLUS_MINUS_1, FIVE)))),
])
def test_a_plus_minus_value_is_the_set_of_its_values_wherever_it_stands(answer, tree):
    assert parse_answer(answer) == tree


@pytest.mark.parametrize("answer, tree", [
    ("\\sqrt[3]{8}", ("pow", num(8), ("div", num(1), num(3)))),
    ("\\sqrt[3]8", ("pow", num(8), ("div", num(1), num(3)))),
    ("\\sqrt[n]{x}", ("pow", ("sym", "x"), ("div", num(1), ("sym", "n")))),
    ("\\sqrt{8}", ("fn", "sqrt", (num(8),))),
])
def test_an_nth_root_is_the_power_one_over_n(answer, tree):
    assert parse_answer(answer) == tree


def test_nth_roots_are_compared_by_value():
    assert math_equal("\\sqrt[3]{8}", "2") and math_equal("\\sqrt[4]{16}", "2")
    assert math_equal("\\sqrt[3]{16}", "2\\sqrt[3]{2}") and not math_equal("\\sqrt[3]{8}", "\\sqrt{8}")


ONE_TO_FOUR = ("matrix", ((num(1), num(2)), (num(3), num(4))))


@pytest.mark.parametrize("environment", ["pmatrix", "bmatrix", "matrix", "Bmatrix", "smallmatrix", "array"])
def test_every_matrix_environment_reads_as_a_matrix(environment):
    assert parse_answer(f"\\begin{{{environment}}} 1 & 2 \\\\ 3 & 4 \\end{{{environment}}}") == ONE_TO_FOUR


@pytest.mark.parametrize("answer", [
    "\\begin{array}{cc} 1 & 2 \\\\ 3 & 4 \\end{array}",
    "\\begin{array}{|c|c|} 1 & 2 \\\\ 3 & 4 \\end{array}",  # the column spec is skipped, rules and all
    "\\left(\\begin{array}{cc} 1 & 2 \\\\ 3 & 4 \\end{array}\\right)",
])
def test_an_arrays_column_spec_is_skipped(answer):
    assert parse_answer(answer) == ONE_TO_FOUR


def test_a_determinant_or_another_environment_is_refused_by_name():
    with pytest.raises(ParseError, match="^environment 'vmatrix'$"):
        parse_answer("\\begin{vmatrix} 1 & 2 \\\\ 3 & 4 \\end{vmatrix}")


TWO, ZERO = ("add", (num(1), num(1))), ("add", (num(1), ("neg", num(1))))


@pytest.mark.parametrize("answer, tree", [
    # each operation around a \pm value is taken once per sign
    ("2(1 \\pm 1)", ("set", (("mul", (num(2), TWO)), ("mul", (num(2), ZERO))))),
    ("\\frac{\\pm 1}{2}", ("set", (("div", num(1), num(2)), ("div", ("neg", num(1)), num(2))))),
    ("(1 \\pm 1)^2", ("set", (("pow", TWO, num(2)), ("pow", ZERO, num(2))))),
    ("-(1 \\pm 1)", ("set", (("neg", TWO), ("neg", ZERO)))),
    ("(1 \\pm 1)\\%", ("set", (("pct", TWO), ("pct", ZERO)))),
    ("\\sqrt{1 \\pm 1}", ("set", (("fn", "sqrt", (TWO,)), ("fn", "sqrt", (ZERO,))))),
])
def test_plus_minus_inside_an_operation_gives_one_value_per_sign(answer, tree):
    assert parse_answer(answer) == tree


@pytest.mark.parametrize("answer, tree", [
    ("5 meters", ("unit", num(5), "meter")),
    ("-5 meters", ("unit", ("neg", num(5)), "meter")),
    ("\\frac{1}{2} meters", ("unit", ("div", num(1), num(2)), "meter")),
    ("-\\frac{1}{2} kg", ("unit", ("neg", ("div", num(1), num(2))), "kg")),
    ("5\\text{ inches}", ("unit", num(5), "inch")),
    ("5\\text{ boxes}", ("unit", num(5), "box")),
    ("5\\text{ mins}", ("unit", num(5), "min")),
    ("5\\text{ lbs}", ("unit", num(5), "lbs")),  # 3 letters or fewer: an abbreviation, kept whole
    ("x meters", ("text", "x meters")),  # only a number takes a unit
])
def test_a_number_with_a_unit_word_keeps_the_unit_in_the_singular(answer, tree):
    assert parse_answer(answer) == tree


@pytest.mark.parametrize("answer, tree", [
    ("\\frac12", ("div", num(1), num(2))),  # an unbraced argument is one digit
    ("\\frac123", ("mul", (("div", num(1), num(2)), num(3)))),
    ("\\sqrt2.25", ("fn", "sqrt", (("num", Fraction(9, 4), 2),))),  # but a decimal stays whole
    ("\\frac x2", ("div", ("sym", "x"), num(2))),
    ("\\frac\\pi2", ("div", ("const", "pi"), num(2))),
    ("\\text{\\{1, 2\\}}", ("set", (num(1), num(2)))),  # escaped braces inside a style command's group
])
def test_unbraced_and_nested_arguments(answer, tree):
    assert parse_answer(answer) == tree


def test_an_argument_that_is_an_operator_is_refused_by_name():
    with pytest.raises(ParseError, match="^expected an argument, got '\\+'$"):
        parse_answer("\\frac+2")


X = ("sym", "x")


@pytest.mark.parametrize("answer, tree", [
    ("\\log_2 8", ("fn", "log", (num(8), num(2)))),  # the base as the second argument
    ("\\log_{2}(8)", ("fn", "log", (num(8), num(2)))),
    ("\\ln x", ("fn", "ln", (X,))),
    ("\\sin(x)", ("fn", "sin", (X,))),
    ("\\sin^2 x", ("pow", ("fn", "sin", (X,)), num(2))),  # sin^2 x is (sin x)^2
    ("\\sin^{2}(x)", ("pow", ("fn", "sin", (X,)), num(2))),
    ("\\sin x^2", ("fn", "sin", (("pow", X, num(2)),))),
    ("\\theta + 1", ("add", (("sym", "theta"), num(1)))),
    ("\\emptyset", ("set", ())),
    ("\\varnothing", ("set", ())),
])
def test_functions_greek_letters_and_the_empty_set(answer, tree):
    assert parse_answer(answer) == tree


@pytest.mark.parametrize("answer, message", [
    ("\\foo", "unsupported command \\\\foo"),
    ("\\sin_2 x", "unexpected '_'"),  # only a logarithm takes a base
])
def test_commands_the_parser_does_not_know_are_refused_by_name(answer, message):
    with pytest.raises(ParseError, match=f"^{message}$"):
        parse_answer(answer)


@pytest.mark.parametrize("answer, tree", [
    ("\\{\\}", ("set", ())),
    ("\\left\\{ \\right\\}", ("set", ())),
    ("\\{x\\}", ("set", (X,))),
    ("\\{1; 2\\}", ("set", (num(1), num(2)))),  # a semicolon separates items as a comma does
    ("(1;2)", ("tuple", (num(1), num(2)))),
])
def test_braces_and_brackets_hold_items_separated_by_commas_or_semicolons(answer, tree):
    assert parse_answer(answer) == tree


@pytest.mark.parametrize("answer, message", [
    ("\\sqrt{2", "expected '}', got ''"),
    ("\\sum_{2=1}^{3} k", "\\\\sum without an index"),  # the index must be a variable
    ("\\sum_{k}^{3} k", "\\\\sum without an index"),
])
def test_malformed_groups_are_refused_by_name(answer, message):
    with pytest.raises(ParseError, match=f"^{message}$"):
        parse_answer(answer)


def test_plus_minus_expands_to_sixteen_values_and_no_more():
    assert len(parse_answer("(1 \\pm 1)(2 \\pm 1)(3 \\pm 1)(4 \\pm 1)")[1]) == 16
    with pytest.raises(ParseError, match="^too many \\\\pm$"):
        parse_answer("(1 \\pm 1)(2 \\pm 1)(3 \\pm 1)(4 \\pm 1)(5 \\pm 1)")


TWO_X = ("mul", (num(2), X))


@pytest.mark.parametrize("answer, tree", [
    # without brackets a function takes the implicit product that follows, as math-verify reads it
    ("\\cos 2x", ("fn", "cos", (TWO_X,))),
    ("\\log 2x", ("fn", "log", (TWO_X,))),
    ("\\sin \\pi x", ("fn", "sin", (("mul", (("const", "pi"), X)),))),
    ("\\sin^2 2x", ("pow", ("fn", "sin", (TWO_X,)), num(2))),
    ("\\sin 2x + 1", ("add", (("fn", "sin", (TWO_X,)), num(1)))),
    # up to another function, an explicit operator, a bracket or a second number
    ("\\sin x \\cos x", ("mul", (("fn", "sin", (X,)), ("fn", "cos", (X,))))),
    ("\\sin x \\cdot y", ("mul", (("fn", "sin", (X,)), ("sym", "y")))),
    ("\\sin x (x+1)", ("mul", (("fn", "sin", (X,)), ("add", (X, num(1)))))),
    ("\\sin 2 3", ("mul", (("fn", "sin", (num(2),)), num(3)))),
])
def test_a_function_without_brackets_takes_the_product_that_follows(answer, tree):
    assert parse_answer(answer) == tree


def test_cos_2x_is_the_cosine_of_2x_not_x_times_cos_2():
    """It was x cos(2): x\\cos 2 scored as right for a gold of \\cos 2x, and the double-angle forms as wrong."""
    assert math_equal("\\cos 2x", "\\cos(2x)") and not math_equal("\\cos 2x", "x\\cos 2")
    assert math_equal("\\sin 2x", "2\\sin x \\cos x") and math_equal("\\cos 2x", "1 - 2\\sin^2 x")


ONE, TWO_NUM, THREE = num(1), num(2), num(3)


@pytest.mark.parametrize("answer, tree", [
    ("(1, 2]", ("interval", False, ONE, TWO_NUM, True)),
    ("[1, 2)", ("interval", True, ONE, TWO_NUM, False)),
    ("[1, 2]", ("interval", True, ONE, TWO_NUM, True)),
    ("[1; 2]", ("interval", True, ONE, TWO_NUM, True)),
    ("(1, 2)", ("tuple", (ONE, TWO_NUM))),  # also the open interval: compare.py decides
    ("(1, 2, 3)", ("tuple", (ONE, TWO_NUM, THREE))),
    ("[1, 2, 3]", ("tuple", (ONE, TWO_NUM, THREE))),
    ("(3)", THREE),
    ("[3]", THREE),
])
def test_brackets_make_intervals_tuples_or_groupings(answer, tree):
    assert parse_answer(answer) == tree


@pytest.mark.parametrize("answer, message", [
    ("[1, 2, 3)", "mismatched brackets"),
    ("(1, 2, 3]", "mismatched brackets"),
    ("[3)", "half-open bracket around one value"),
    ("(3]", "half-open bracket around one value"),
    ("(1, 2", "unclosed '\\('"),
])
def test_brackets_that_close_wrong_are_refused_by_name(answer, message):
    with pytest.raises(ParseError, match=f"^{message}$"):
        parse_answer(answer)


@pytest.mark.parametrize("answer, tree", [
    (".5", ("num", Fraction(1, 2), 1)),  # the places written are kept for rounding checks
    ("0.5", ("num", Fraction(1, 2), 1)),
    ("1.25", ("num", Fraction(5, 4), 2)),
    ("5.", num(5)),
    ("3 \\cdot 2", ("mul", (THREE, TWO_NUM))),
    ("3 \\times 2", ("mul", (THREE, TWO_NUM))),
    ("1 \\mp 2", ("set", (("add", (ONE, TWO_NUM)), ("add", (ONE, ("neg", TWO_NUM)))))),
])
def test_decimals_and_operators_between_numbers(answer, tree):
    assert parse_answer(answer) == tree


@pytest.mark.parametrize("answer, tree", [
    ("\\sin^{-1} x", ("fn", "arcsin", (X,))),  # the inverse function, as the notation means
    ("\\cos^{-1}(0.5)", ("fn", "arccos", (("num", Fraction(1, 2), 1),))),
    ("\\tan^{-1} x", ("fn", "arctan", (X,))),
    ("\\sin^{-2} x", ("pow", ("fn", "sin", (X,)), ("neg", num(2)))),  # any other power is a power
    ("\\log^{-1} x", ("pow", ("fn", "log", (X,)), ("neg", num(1)))),
])
def test_a_trig_function_to_the_minus_one_is_its_inverse(answer, tree):
    assert parse_answer(answer) == tree


@pytest.mark.parametrize("function", ["cot", "sec", "csc", "sinh", "cosh", "tanh"])
def test_minus_one_on_a_function_whose_inverse_has_no_standard_name_here_is_refused(function):
    with pytest.raises(ParseError, match=f"^\\\\{function}\\^{{-1}}: an inverse or a reciprocal$"):
        parse_answer(f"\\{function}^{{-1}} x")


def test_sin_to_the_minus_one_is_arcsin_not_the_cosecant():
    """It was 1/sin x: \\frac{1}{\\sin x} scored as right for a gold of \\sin^{-1} x, and \\arcsin x as wrong."""
    assert math_equal("\\sin^{-1} x", "\\arcsin x") and not math_equal("\\sin^{-1} x", "\\frac{1}{\\sin x}")
    assert math_equal("\\tan^{-1} 1", "\\frac{\\pi}{4}")


@pytest.mark.parametrize("answer, tree", [
    ("\\lfloor 2.5 \\rfloor", ("fn", "floor", (("num", Fraction(5, 2), 1),))),
    ("\\lceil 2.5 \\rceil", ("fn", "ceil", (("num", Fraction(5, 2), 1),))),
    ("\\left\\lfloor \\frac{7}{2} \\right\\rfloor", ("fn", "floor", (("div", num(7), num(2)),))),
    ("2\\lfloor x \\rfloor + 1", ("add", (("mul", (num(2), ("fn", "floor", (X,)))), num(1)))),
    ("\\lfloor x \\rfloor \\lceil x \\rceil", ("mul", (("fn", "floor", (X,)), ("fn", "ceil", (X,))))),
])
def test_floor_and_ceiling_brackets(answer, tree):
    assert parse_answer(answer) == tree


@pytest.mark.parametrize("answer, message", [
    ("\\lfloor 2.5", "expected '\\\\\\\\rfloor', got ''"),
    ("\\lfloor 2.5 \\rceil", "expected '\\\\\\\\rfloor', got '\\\\\\\\rceil'"),
])
def test_a_floor_bracket_must_close_as_it_opened(answer, message):
    with pytest.raises(ParseError, match=f"^{message}$"):
        parse_answer(answer)


def test_floor_and_ceiling_are_compared_by_value():
    """They were unsupported commands: \\lfloor 2.5 \\rfloor scored 0 against 2 (math-verify: 1)."""
    assert math_equal("\\lfloor 2.5 \\rfloor", "2") and math_equal("\\lceil 2.5 \\rceil", "3")
    assert math_equal("\\lfloor -2.5 \\rfloor", "-3") and not math_equal("\\lfloor 2.5 \\rfloor", "3")
    assert not math_equal("\\lfloor x \\rfloor", "\\lceil x \\rceil")


@pytest.mark.parametrize("answer, tree", [
    ("\\max(1, 2)", ("fn", "max", (num(1), num(2)))),
    ("\\min\\{3, x, 5\\}", ("fn", "min", (num(3), X, num(5)))),
    ("\\gcd(12, 18)", ("fn", "gcd", (num(12), num(18)))),
    ("\\operatorname{lcm}(4, 6)", ("fn", "lcm", (num(4), num(6)))),
    ("\\mathrm{gcd}\\{4, 6\\}", ("fn", "gcd", (num(4), num(6)))),
    ("\\text{lcm} (4, 6)", ("fn", "lcm", (num(4), num(6)))),
    ("max(1, 2)", ("fn", "max", (num(1), num(2)))),
    ("2\\max(x, 1)^2", ("mul", (num(2), ("pow", ("fn", "max", (X, num(1))), num(2))))),
    ("\\sin x \\max(1, 2)", ("mul", (("fn", "sin", (X,)), ("fn", "max", (num(1), num(2)))))),
])
def test_max_min_gcd_and_lcm_take_a_bracketed_list(answer, tree):
    assert parse_answer(answer) == tree


@pytest.mark.parametrize("answer, tree", [
    ("5 min", ("unit", num(5), "min")),
    ("5\\text{ min}", ("unit", num(5), "min")),
    ("max", ("mul", (("sym", "m"), ("sym", "a"), ("sym", "x")))),
])
def test_the_names_without_a_bracket_after_them_are_what_they_were(answer, tree):
    assert parse_answer(answer) == tree


@pytest.mark.parametrize("answer, message", [
    ("\\max_{x} f(x)", "\\\\max without its arguments in brackets"),
    ("\\gcd 4", "\\\\gcd without its arguments in brackets"),
    ("\\min()", "\\\\min of nothing"),
    ("\\max(1, 2", "expected '\\)', got ''"),
])
def test_a_list_function_without_its_list_is_refused_by_name(answer, message):
    with pytest.raises(ParseError, match=f"^{message}$"):
        parse_answer(answer)


@pytest.mark.parametrize("answer, tree", [
    ("\\lvert -3 \\rvert", ("fn", "abs", (("neg", num(3)),))),
    ("\\left\\lvert x \\right\\rvert", ("fn", "abs", (X,))),
    ("\\vert x \\vert + 1", ("add", (("fn", "abs", (X,)), num(1)))),
    ("\\mathbb{R}", ("tuple", (("neg", ("const", "inf")), ("const", "inf")))),  # (a, b): compare.py's open interval
    ("x \\in \\mathbb R", ("tuple", (("neg", ("const", "inf")), ("const", "inf")))),
])
def test_vert_bars_are_absolute_values_and_the_reals_are_the_whole_line(answer, tree):
    assert parse_answer(answer) == tree


def test_the_reals_and_vert_bars_are_compared_by_value():
    """Both were unsupported commands (\\lvert -3 \\rvert scored 0 against 3; math-verify: 1)."""
    assert math_equal("\\lvert -3 \\rvert", "3") and math_equal("\\mathbb{R}", "(-\\infty, \\infty)")
    assert not math_equal("\\mathbb{R}", "[0, \\infty)") and not math_equal("\\mathbb{Z}", "(-\\infty, \\infty)")
    assert not math_equal("\\mathbb{RR}", "(-\\infty, \\infty)")


def test_max_min_gcd_and_lcm_are_compared_by_value():
    """They were unsupported commands (\\max(1, 2) scored 0 against 2; math-verify: 1)."""
    assert math_equal("\\max(1, 2)", "2") and not math_equal("\\max(1, 2)", "1")
    assert math_equal("\\min\\{-3, \\frac{1}{2}\\}", "-3") and math_equal("\\max(-1.5, -2)", "-1.5")
    assert math_equal("\\gcd(12, -18)", "6") and math_equal("\\operatorname{lcm}(4, 6, 10)", "60")
    assert math_equal("\\gcd(0, 0)", "0") and not math_equal("\\gcd(4, 6)", "4")
    assert not math_equal("\\gcd(1.5, 3)", "1.5")  # of integers only: no value, and unequal to one
    assert math_equal("\\max(x, 2)", "\\max(2, x)") and math_equal("\\max(x, 1) + 1", "1 + \\max(1, x)")
    assert not math_equal("\\max(x, 2)", "\\min(x, 2)")
    assert math_equal("\\gcd(x, 4)", "\\gcd(x, 4)") and not math_equal("\\gcd(x, 4)", "1")
    assert math_equal("\\gcd(4, 6) + x", "x + 2")  # integers beside a symbol: sympy's own gcd of the two


@pytest.mark.parametrize("answer, tree", [
    ("-5\\text{ meters}", ("unit", ("neg", num(5)), "meter")),
    ("\\frac{1}{2}\\text{ cup}", ("unit", ("div", num(1), num(2)), "cup")),
    ("-\\frac{1}{2}\\text{ cups}", ("unit", ("neg", ("div", num(1), num(2))), "cup")),
])
def test_a_number_before_a_text_word_takes_it_as_its_unit(answer, tree):
    assert parse_answer(answer) == tree


@pytest.mark.parametrize("answer", ["-x\\text{ cups}", "\\frac{x}{2}\\text{ cups}", "\\frac{1}{x}\\text{ cups}",
                                    "2^3\\text{ cups}"])
def test_only_a_number_a_negated_number_or_a_fraction_of_numbers_takes_a_text_unit(answer):
    with pytest.raises(ParseError, match="^words mixed with math$"):
        parse_answer(answer)


def test_a_subscript_that_is_a_constant_or_an_expression_names_the_symbol():
    assert parse_answer("a_{\\pi}") == ("sym", "a_pi")
    names = {answer: parse_answer(answer) for answer in (
        "a_{-k}", "a_{k}", "a_{k/2}", "a_{\\frac{k}{2}}", "a_{k^2}", "a_{k^3}", "a_{2k}")}
    assert all(tree[0] == "sym" and tree[1].startswith("a_") for tree in names.values())
    assert names["a_{k/2}"] == names["a_{\\frac{k}{2}}"]  # the same expression, written two ways
    assert len({tree[1] for tree in names.values()}) == len(names) - 1  # every other pair differs


def test_a_trailing_row_break_ends_no_extra_row():
    assert parse_answer("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\\\ \\end{pmatrix}") == ONE_TO_FOUR


@pytest.mark.parametrize("answer, message", [
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 \\end{pmatrix}", "ragged matrix"),
    ("\\begin{pmatrix} 1 , 2 \\end{pmatrix}", "unexpected ',' in matrix"),
    ("\\begin{array}{cc} 1 & 2", "unexpected '' in matrix"),
    ("\\begin{array}{cc", "expected '}', got ''"),
])
def test_a_malformed_matrix_is_refused_by_name(answer, message):
    with pytest.raises(ParseError, match=f"^{message}$"):
        parse_answer(answer)


@pytest.mark.parametrize("answer, tree", [
    ("\\sin 2\\pi", ("fn", "sin", (("mul", (num(2), ("const", "pi"))),))),  # a constant joins the product
    ("\\sin x \\sum_{k=1}^{2} k", ("mul", (("fn", "sin", (X,)), ("fn", "sum", (("sym", "k"), ("sym", "k"), num(1),
                                                                                num(2)))))),
    ("\\sin x \\prod_{k=1}^{2} k", ("mul", (("fn", "sin", (X,)), ("fn", "prod", (("sym", "k"), ("sym", "k"), num(1),
                                                                                  num(2)))))),
    ("\\sin x {y}", ("mul", (("fn", "sin", (X,)), ("sym", "y")))),
    ("\\sin x [y]", ("mul", (("fn", "sin", (X,)), ("sym", "y")))),
])
def test_where_a_functions_bracketless_argument_ends(answer, tree):
    assert parse_answer(answer) == tree


SIN_X, Y = ("fn", "sin", (X,)), ("sym", "y")


@pytest.mark.parametrize("answer, tree", [
    ("\\sin x \\times y", ("mul", (SIN_X, Y))),
    ("\\sin x \\div y", ("div", SIN_X, Y)),
    ("\\sin x \\cup y", ("union", (SIN_X, Y))),
    ("\\sin x \\mp y", ("set", (("add", (SIN_X, Y)), ("add", (SIN_X, ("neg", Y)))))),
    ("\\sin x \\text{ and } y", ("set", (SIN_X, Y))),
])
def test_an_operator_ends_a_functions_bracketless_argument(answer, tree):
    assert parse_answer(answer) == tree


@pytest.mark.parametrize("answer, tree", [
    ("x^-1", ("pow", X, ("neg", num(1)))),  # a signed exponent without braces
    ("x^+2", ("pow", X, num(2))),
    ("x^-y", ("pow", X, ("neg", Y))),
])
def test_an_exponent_may_carry_its_sign_without_braces(answer, tree):
    assert parse_answer(answer) == tree


@pytest.mark.parametrize("answer, tree", [
    ("e", ("const", "e")),
    ("i", ("const", "i")),
    ("2i", ("mul", (num(2), ("const", "i")))),
    ("e(2)", ("mul", (("sym", "e"), num(2)))),  # before a bracket e and i are names, as f(2) is
    ("i(2)", ("mul", (("sym", "i"), num(2)))),
    ("\\sin(x) y", ("mul", (SIN_X, Y))),  # a bracketed argument ends at its bracket
])
def test_e_and_i_are_constants_unless_a_bracket_follows(answer, tree):
    assert parse_answer(answer) == tree


@pytest.mark.parametrize("answer, message", [
    ("{}", "empty group"),
    ("\\sin x \\to y", "trailing '\\\\\\\\to'"),  # an operator the parser does not know ends the expression
    ("\\sin x \\cap y", "trailing '\\\\\\\\cap'"),
    ("\\sin x \\implies y", "trailing '\\\\\\\\implies'"),
])
def test_what_cannot_follow_is_refused_by_name(answer, message):
    with pytest.raises(ParseError, match=f"^{message}$"):
        parse_answer(answer)
