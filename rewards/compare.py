"""Structural equivalence of two answer trees (see latex.py), with a pluggable scalar test.

The same code runs twice: in the caller's process with `exact_scalar_equal`
(fractions only, bounded, answers True/False/None) and, only when some leaf is
undecided (None), inside the time-limited worker with sympy's scalar test.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

Verdict = bool | None  # None: cannot decide here (needs the symbolic worker)
ScalarEqual = Callable[[tuple, tuple], Verdict]

MAX_RESULT_BITS = 4096  # size guard: exact arithmetic refuses numbers larger than this
MAX_FACTORIAL = 300
MAX_SET_ITEMS = 64
MIN_GOLD_ROUNDING_PLACES = 6  # a decimal gold is read as a rounding only when this precise (rationals_match)


class TooLarge(ArithmeticError):
    """A number would exceed the size guard (exponent towers, huge factorials)."""


def exact_value(node: tuple) -> Fraction | None:
    """Exact rational value of a tree, or None if it has symbols/irrationals. Raises TooLarge."""
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "neg":
        inner = exact_value(node[1])
        return None if inner is None else -inner
    if kind in ("add", "mul"):
        values = [exact_value(part) for part in node[1]]
        if any(v is None for v in values):
            return None
        total = Fraction(0) if kind == "add" else Fraction(1)
        for v in values:
            total = total + v if kind == "add" else total * v
            _guard(total)
        return total
    if kind == "div":
        num, den = exact_value(node[1]), exact_value(node[2])
        if num is None or den is None or den == 0:
            return None
        return num / den
    if kind == "pct":
        inner = exact_value(node[1])
        return None if inner is None else inner / 100
    if kind == "pow":
        base, exponent = exact_value(node[1]), exact_value(node[2])
        if base is None or exponent is None or exponent.denominator != 1 or (base == 0 and exponent < 0):
            return None
        bits = max(base.numerator.bit_length(), base.denominator.bit_length())
        if abs(exponent) * max(bits, 1) > MAX_RESULT_BITS and abs(base) != 1 and base != 0:
            raise TooLarge("power too large")
        return base ** int(exponent)
    if kind == "fn" and node[1] == "factorial":
        arg = exact_value(node[2][0])
        if arg is None or arg.denominator != 1 or arg < 0:
            return None
        if arg > MAX_FACTORIAL:
            raise TooLarge("factorial too large")
        result = 1
        for k in range(2, int(arg) + 1):
            result *= k
        return Fraction(result)
    if kind == "fn" and node[1] in _BIG_OPERATORS:
        return _big_operator_value(node)
    if kind == "fn" and node[1] in ("max", "min", "gcd", "lcm"):
        return _list_function_value(node[1], [exact_value(arg) for arg in node[2]])
    if kind == "fn" and node[1] == "binom" and len(node[2]) == 2:
        n, k = exact_value(node[2][0]), exact_value(node[2][1])
        if n is None or k is None:
            return None
        if n.denominator != 1 or k.denominator != 1 or n < 0:
            check_binom_size(n, k)  # sympy's gamma-based value: only small arguments reach it
            return None
        if k < 0 or k > n:
            return Fraction(0)
        check_binom_size(n, k)
        return Fraction(math.comb(int(n), int(k)))
    return None


def _list_function_value(name: str, values: list[Fraction | None]) -> Fraction | None:
    """max/min of rationals; gcd/lcm of integers (math.gcd's and math.lcm's signs: never negative); else None."""
    if any(value is None for value in values):
        return None
    if name in ("max", "min"):
        return max(values) if name == "max" else min(values)
    if any(value.denominator != 1 for value in values):
        return None
    integers = [value.numerator for value in values]
    if name == "gcd":
        return Fraction(math.gcd(*integers))
    if sum(abs(n).bit_length() for n in integers) > MAX_RESULT_BITS:
        raise TooLarge("lcm too large")
    return Fraction(math.lcm(*integers))


_BIG_OPERATORS = ("sum", "prod")
MAX_BIG_OPERATOR_WORK = 20_000  # terms times body size: a finite \sum or \prod is evaluated only this small


def _big_operator_value(node: tuple) -> Fraction | None:
    """Exact value of \\sum_{k=a}^{b} body / \\prod with integer bounds and a rational body; else None."""
    body, (_, index), lower, upper = node[2]
    low, high = exact_value(lower), exact_value(upper)
    if low is None or high is None or low.denominator != 1 or high.denominator != 1:
        return None
    terms = max(int(high - low) + 1, 0)
    size = len(repr(body))
    if terms * size > MAX_BIG_OPERATOR_WORK or "'sum'" in repr(body) or "'prod'" in repr(body):
        return None
    total = Fraction(0) if node[1] == "sum" else Fraction(1)
    for k in range(int(low), int(high) + 1):
        value = exact_value(_substitute(body, index, ("num", Fraction(k), None)))
        if value is None:
            return None
        total = total + value if node[1] == "sum" else total * value
        _guard(total)
    return total


def _substitute(node, name: str, value: tuple):
    """The tree with the symbol `name` replaced by `value`."""
    if not isinstance(node, tuple):
        return node
    if node == ("sym", name):
        return value
    return tuple(_substitute(part, name, value) for part in node)


def check_binom_size(n, k) -> None:
    """Size guard for binom(n, k) with numeric n, k (Fractions or numbers), as for factorial. Raises TooLarge.

    Integers 0 <= k <= n: binom(n, k) has at most min(k, n-k) * bits(n) bits, which must stay under
    MAX_RESULT_BITS (binom(1000, 2) is fine, binom(10^9, 10^5) is not). Any other numeric arguments
    (negative or non-integer, evaluated through gamma) must stay within the factorial bound.
    """
    if Fraction(n).denominator == 1 and Fraction(k).denominator == 1 and 0 <= k <= n:
        n, k = int(n), int(k)
        if min(k, n - k) * max(n.bit_length(), 1) > MAX_RESULT_BITS:
            raise TooLarge("binomial too large")
        return
    if abs(n) > MAX_FACTORIAL or abs(k) > MAX_FACTORIAL:
        raise TooLarge("binomial too large")


def _guard(value: Fraction) -> None:
    if value.numerator.bit_length() > MAX_RESULT_BITS or value.denominator.bit_length() > MAX_RESULT_BITS:
        raise TooLarge("intermediate value too large")


def decimal_places(node: tuple) -> int | None:
    """Decimals written in a plain (possibly negated) decimal literal, else None."""
    while node[0] == "neg":
        node = node[1]
    return node[2] if node[0] == "num" else None


def rationals_match(pred: Fraction, gold: Fraction, pred_places: int | None, gold_places: int | None) -> bool:
    """Exact equality, or a predicted decimal written to >= 2 places that is the gold value rounded.

    Rounding is read into the prediction (0.67 answers 2/3), not into a decimal gold: a gold 0.25 is 0.25,
    never the rounding of a predicted 0.254 (or 127/500), and 12.50 is not 12.496. The one exception is a gold
    computed to many places (>= MIN_GOLD_ROUNDING_PLACES, 4.123105625617661 for sqrt(17)) against a prediction
    in exact form (not a decimal literal): a wrong exact answer within half a unit of the 6th place is no
    real risk, and such golds are roundings by construction.
    """
    if pred == gold:
        return True
    for written, other, places in ((pred, gold, pred_places), (gold, pred, gold_places)):
        if written is gold and (pred_places is not None or (gold_places or 0) < MIN_GOLD_ROUNDING_PLACES):
            continue
        if places is not None and places >= 2 and abs(written) * 10**places >= 10:
            if abs(written - other) < Fraction(1, 2 * 10**places):
                return True
    return False


def canonical(node: tuple) -> tuple:
    """Order-independent shape: sorted add/mul operands, numbers by value (0.5 and 1/2 alike)."""
    kind = node[0]
    if kind == "num":
        return ("num", node[1])
    if kind in ("add", "mul", "set"):
        return (kind, tuple(sorted((canonical(p) for p in node[1]), key=repr)))
    if kind in ("sym", "const", "text"):
        return node
    if kind == "fn":
        return ("fn", node[1], tuple(canonical(a) for a in node[2]))
    if kind == "rel":
        return ("rel", node[1], canonical(node[2]), canonical(node[3]))
    if kind == "interval":
        return ("interval", node[1], canonical(node[2]), canonical(node[3]), node[4])
    if kind == "matrix":
        return ("matrix", tuple(tuple(canonical(x) for x in row) for row in node[1]))
    if kind in ("tuple", "chain"):
        return (kind, tuple(canonical(p) for p in node[1]))
    if kind == "union":
        return (kind, tuple(sorted((canonical(p) for p in node[1]), key=repr)))
    if kind == "unit":
        return (kind, canonical(node[1]), node[2])
    return (kind, *(canonical(p) for p in node[1:]))  # neg, div, pow, pct, eq


def exact_scalar_equal(pred: tuple, gold: tuple) -> Verdict:
    """Fast leaf test in the caller's process: exact rationals, else same canonical shape, else undecided."""
    pred_value, gold_value = exact_value(pred), exact_value(gold)
    if pred_value is not None and gold_value is not None:
        return rationals_match(pred_value, gold_value, decimal_places(pred), decimal_places(gold))
    if canonical(pred) == canonical(gold):
        return True
    if not (is_scalar(pred) and is_scalar(gold)):
        return False
    return None


_NON_SCALAR_KINDS = ("text", "set", "tuple", "interval", "union", "matrix", "eq", "rel", "chain", "unit")


def is_scalar(node: tuple) -> bool:
    """A number or an expression with no container, relation or text in it.

    Otherwise it has no value to compare: a word, or arithmetic on a container (2(1,2), f(1,2), \\frac{x=1}{2},
    \\sqrt{\\{1,2\\}}), which is wrong against any gold it is not written the same as.
    """
    kind = node[0]
    if kind in _NON_SCALAR_KINDS:
        return False
    if kind in ("add", "mul"):
        return all(is_scalar(part) for part in node[1])
    if kind in ("neg", "pct"):
        return is_scalar(node[1])
    if kind in ("div", "pow"):
        return is_scalar(node[1]) and is_scalar(node[2])
    if kind == "fn":  # a \sum or \prod without a value is compared as written
        return node[1] not in _BIG_OPERATORS and all(is_scalar(arg) for arg in node[2])
    return True  # num, sym, const


def _all(verdicts) -> Verdict:
    undecided = False
    for verdict in verdicts:
        if verdict is False:
            return False
        undecided |= verdict is None
    return None if undecided else True


def _any(verdicts) -> Verdict:
    undecided = False
    for verdict in verdicts:
        if verdict is True:
            return True
        undecided |= verdict is None
    return None if undecided else False


def equivalent(pred: tuple, gold: tuple, scalar_equal: ScalarEqual) -> Verdict:
    """Is the predicted tree the gold answer? True / False / None (undecided by this scalar test)."""
    if pred[0] == "unit" or gold[0] == "unit":
        pred_unit = pred[2] if pred[0] == "unit" else None
        gold_unit = gold[2] if gold[0] == "unit" else None
        if pred_unit and gold_unit and pred_unit != gold_unit:
            return False  # '5 m' is not '5 cm'
        return equivalent(pred[1] if pred_unit else pred, gold[1] if gold_unit else gold, scalar_equal)
    if pred[0] == "pct" or gold[0] == "pct":
        return _percent(pred, gold, scalar_equal)
    if pred[0] == gold[0] == "rel" and pred[1] == gold[1]:
        sides = _all((equivalent(pred[2], gold[2], scalar_equal), equivalent(pred[3], gold[3], scalar_equal)))
        # the same inequality with terms moved or scaled by a positive constant: x < 1 and -x > -1. Sides left
        # undecided (x < log_2 pi^2 against 2 log_2 pi > x) go on to the scalar test that can decide them.
        return _any((sides, _same_up_to_factor(pred, gold, scalar_equal, positive=pred[1] != "!=")))
    pred, gold = _matrix_value(_as_interval(pred)), _matrix_value(_as_interval(gold))
    # "x = 3" against "3": judge the value; both equations: compare them as equations
    if pred[0] == "eq" and gold[0] != "eq":
        return equivalent(pred[2], gold, scalar_equal)
    if gold[0] == "eq" and pred[0] != "eq" and _is_name(gold[1]):  # "(p, q) = (3, 2)", "AB = 4": the value answers
        return equivalent(pred, gold[2], scalar_equal)
    if gold[0] == "tuple":  # "x = 3, y = -1" answers "(3, -1)"
        pred = _assignments_as_tuple(pred)
    if pred[0] == "tuple":
        gold = _assignments_as_tuple(gold)
    kind = gold[0]
    if kind in _CONTAINERS or pred[0] in _CONTAINERS:
        return _containers(pred, gold, scalar_equal)
    if kind == "eq" and pred[0] == "eq":
        sides = _any((
            _all((equivalent(pred[1], gold[1], scalar_equal), equivalent(pred[2], gold[2], scalar_equal))),
            _all((equivalent(pred[1], gold[2], scalar_equal), equivalent(pred[2], gold[1], scalar_equal))),
        ))
        if sides is True or _is_assignment(pred) or _is_assignment(gold):  # "2x = 6" does not answer "x = 3"
            return sides
        # the same curve written another way: 2x+4y-3=0 and y=-x/2+3/4, a plane with every sign flipped
        return _any((sides, _same_up_to_factor(pred, gold, scalar_equal, positive=False)))
    if kind == pred[0] == "chain" and len(pred[1]) == len(gold[1]):  # 0 < 2x < 1 and 0 < x + x < 1: link by link
        return _all(equivalent(p, g, scalar_equal) for p, g in zip(pred[1], gold[1]))
    # Numbers and expressions by value; what has none (text, relations but the same one on both sides, compared
    # above, chains of other lengths) the leaf test compares as written.
    return scalar_equal(pred, gold)


# Deterministic, generic sample values (irrational-looking, away from 0, 1 and small integers).
_SAMPLE_VALUES = (Fraction(37, 101), Fraction(173, 61), Fraction(-59, 47))


def sample_points(variables: list) -> list[dict]:
    """A few generic points, each giving every variable (any hashable key) a distinct rational value."""
    count = len(_SAMPLE_VALUES)
    return [{var: _SAMPLE_VALUES[(offset + k) % count] + k for k, var in enumerate(variables)} for offset in range(count)]


def _same_up_to_factor(pred: tuple, gold: tuple, scalar_equal: ScalarEqual, positive: bool) -> Verdict:
    """Is lhs - rhs of pred a constant k != 0 (k > 0 if positive) times that of gold?

    k is read off exactly at generic rational points, which also reject most non-matches in-process;
    the identity pred_diff == k * gold_diff is then left to the scalar test (sympy in the worker).
    """
    # lhs - rhs: the last two fields of both ("eq", lhs, rhs) and ("rel", op, lhs, rhs)
    pred_diff, gold_diff = (("add", (node[-2], ("neg", node[-1]))) for node in (pred, gold))
    names = sorted(_symbols(pred_diff) | _symbols(gold_diff))
    if not names:
        return False
    ratios = set()
    try:
        for values in sample_points(names):
            p, g = exact_value(_at_point(pred_diff, values)), exact_value(_at_point(gold_diff, values))
            if p is None or g is None:
                return False  # not rational at a rational point (radicals, functions): not decided this way
            if p == 0 or g == 0:
                if p != g:
                    return False
                continue
            ratios.add(p / g)
    except TooLarge:
        return False
    if len(ratios) != 1:
        return False
    factor = ratios.pop()
    if positive and factor < 0:
        return False
    return scalar_equal(pred_diff, ("mul", (("num", factor, None), gold_diff)))


def _at_point(node: tuple, values: dict[str, Fraction]) -> tuple:
    """The arithmetic tree with its symbols replaced by numbers (other kinds stay, and are not rational)."""
    kind = node[0]
    if kind == "sym":
        return ("num", values[node[1]], None)
    if kind in ("add", "mul"):
        return (kind, tuple(_at_point(part, values) for part in node[1]))
    if kind in ("neg", "pct"):
        return (kind, _at_point(node[1], values))
    if kind in ("div", "pow"):
        return (kind, _at_point(node[1], values), _at_point(node[2], values))
    return node


def _symbols(node) -> set[str]:
    if not isinstance(node, tuple):
        return set()
    if len(node) == 2 and node[0] == "sym":
        return {node[1]}
    return set().union(*(_symbols(part) for part in node))


_CONTAINERS = ("tuple", "ratio", "set", "interval", "union", "matrix")
# What a name is built from: AB, x_1, \\frac{NO}{BO}, V_1:V_2, |AB|, f(x), (p, q); a number or a sum makes it an expression
_NAME_KINDS = ("sym", "mul", "div", "ratio", "tuple", "fn")


def _is_name(node: tuple) -> bool:
    """Is this left side a name for the answer (letters only, no number, no sum), so that its value answers it?"""
    if node[0] == "sym":
        return True
    if node[0] not in _NAME_KINDS or node[0] == "fn" and node[1] != "abs":
        return False
    parts = node[1] if node[0] in ("mul", "ratio", "tuple") else node[1:] if node[0] == "div" else node[2]
    return all(_is_name(part) for part in parts)


def _is_assignment(equation: tuple) -> bool:
    """'x = 3', 'y = \\sqrt{2}': a variable given a value, which only the same value answers."""
    return equation[1][0] == "sym" and not _symbols(equation[2])


def _percent(pred: tuple, gold: tuple, scalar_equal: ScalarEqual) -> Verdict:
    """A gold of 28% matches 0.28 and 28 (the sign left off); a predicted 28% means 0.28, never 28."""
    if pred[0] == "pct" and gold[0] == "pct":
        return equivalent(pred[1], gold[1], scalar_equal)
    pct, other = (pred, gold) if pred[0] == "pct" else (gold, pred)
    as_fraction = ("div", pct[1], ("num", Fraction(100), None))
    if pct is pred:  # the model wrote the sign: "4 4/9%" is 2/45, not the gold 40/9
        if _is_number_literal(pct[1]) and _is_number_literal(gold) and abs(exact_value(gold)) >= 1:
            # a bare-number gold left its sign off (GSM8K never writes %): "25%" answers 25 as well as 0.25.
            # Only a literal written with the sign, against a gold >= 1 in size: a gold below 1 (0.75) reads as a
            # fraction, so "0.75%" and "\frac34%" do not answer it.
            return _any((equivalent(as_fraction, gold, scalar_equal), equivalent(pct[1], gold, scalar_equal)))
        return equivalent(as_fraction, gold, scalar_equal)
    return _any((equivalent(other, pct[1], scalar_equal), equivalent(other, as_fraction, scalar_equal)))


def _is_number_literal(node: tuple) -> bool:
    """An integer or decimal literal, possibly negated: 25, -3, 12.5 (not 28/100, 1 1/4 or an expression)."""
    while node[0] == "neg":
        node = node[1]
    return node[0] == "num" and (node[2] is not None or node[1].denominator == 1)


def _assignments_as_tuple(node: tuple) -> tuple:
    """x = 3, y = -1 -> (3, -1): values given to two or more names written in alphabetical order, the order an
    ordered pair's names take ((x, y), (a, b, c), (r, theta)). Written in another order (y = -1, x = 3) they are
    left a list of equations: either order may be the one meant, and a wrong guess would pay a wrong answer."""
    if node[0] != "set" or len(node[1]) < 2 or any(item[0] != "eq" or item[1][0] != "sym" for item in node[1]):
        return node
    names = [item[1][1] for item in node[1]]
    if any(first >= second for first, second in zip(names, names[1:])):
        return node
    return ("tuple", tuple(item[2] for item in node[1]))


def _as_interval(node: tuple) -> tuple:
    """x > 3 -> (3, oo); 1 <= x < 2 -> [1, 2); x != 0 -> (-oo, 0) U (0, oo): a one-variable inequality is its
    solution interval(s)."""
    inf = ("const", "inf")
    if node[0] == "rel" and node[1] == "!=" and (node[2][0] == "sym") != (node[3][0] == "sym"):
        point = node[3] if node[2][0] == "sym" else node[2]
        return ("union", (("interval", False, ("neg", inf), point, False), ("interval", False, point, inf, False)))
    if node[0] == "rel" and node[1] in ("<", "<="):
        closed = node[1] == "<="
        if node[2][0] == "sym" and node[3][0] != "sym":
            return ("interval", False, ("neg", inf), node[3], closed)
        if node[3][0] == "sym" and node[2][0] != "sym":
            return ("interval", closed, node[2], inf, False)
    if node[0] == "chain" and len(node[1]) == 2 and node[1][0][0] == node[1][1][0] == "rel":  # links may be eq
        (_, op1, lo, var1), (_, op2, var2, hi) = node[1]
        if var1 == var2 and var1[0] == "fn" and var1[1] == "abs" and var1[2][0][0] == "sym":
            return _abs_between(lo, op1 == "<=", hi, op2 == "<=") or node
        # the range of a variable or of a named quantity: 0 < f(x) < 1 is (0, 1); 0 < 2x < 1 is not
        if var1 == var2 and (var1[0] == "sym" or _is_name(var1) and not (_symbols(lo) or _symbols(hi))):
            return ("interval", op1 == "<=", lo, hi, op2 == "<=")
    return node


def _abs_between(lo: tuple, lo_closed: bool, hi: tuple, hi_closed: bool) -> tuple | None:
    """1 <= |z| <= 3/2 -> [-3/2, -1] U [1, 3/2], and 0 <= |z| < 1 or -1 < |z| < 1 -> (-1, 1): the values of z,
    for exact bounds lo < hi with hi > 0 (else None)."""
    try:
        low, high = exact_value(lo), exact_value(hi)
    except TooLarge:
        return None
    if low is None or high is None or low >= high or high <= 0:
        return None
    if low < 0 or low == 0 and lo_closed:  # z = 0 joins the two halves
        return ("interval", hi_closed, ("neg", hi), hi, hi_closed)
    left = ("interval", hi_closed, ("neg", hi), ("neg", lo), lo_closed)
    return ("union", (left, ("interval", lo_closed, lo, hi, hi_closed)))


def _containers(pred: tuple, gold: tuple, scalar_equal: ScalarEqual) -> Verdict:
    kinds = {pred[0], gold[0]}
    if kinds == {"interval", "tuple"}:  # (a, b) is both a pair and the open interval
        pair, interval = (pred, gold) if pred[0] == "tuple" else (gold, pred)
        if len(pair[1]) != 2 or interval[1] or interval[4]:
            return False
        return _all(equivalent(p, g, scalar_equal) for p, g in zip(pair[1], interval[2:4]))
    if pred[0] != gold[0] and kinds != {"set", "union"}:
        return False
    kind = gold[0]
    if kind == "interval":
        if pred[1] != gold[1] or pred[4] != gold[4]:
            return False
        return _all((equivalent(pred[2], gold[2], scalar_equal), equivalent(pred[3], gold[3], scalar_equal)))
    if kind in ("tuple", "ratio"):
        if len(pred[1]) != len(gold[1]):
            return False
        return _all(equivalent(p, g, scalar_equal) for p, g in zip(pred[1], gold[1]))
    if kind == "matrix":
        if len(pred[1]) != len(gold[1]) or any(len(p) != len(g) for p, g in zip(pred[1], gold[1])):
            return False
        return _all(equivalent(p, g, scalar_equal) for prow, grow in zip(pred[1], gold[1]) for p, g in zip(prow, grow))
    return _unordered(pred[1], gold[1], scalar_equal)


def _unordered(pred_items: tuple, gold_items: tuple, scalar_equal: ScalarEqual) -> Verdict:
    """Same items in any order (a perfect matching), duplicates ignored as in a set."""
    pred_items, gold_items = tuple(dict.fromkeys(pred_items)), tuple(dict.fromkeys(gold_items))
    if len(pred_items) != len(gold_items):
        return False
    if len(gold_items) > MAX_SET_ITEMS:
        raise TooLarge("set too large")
    table = [[equivalent(p, g, scalar_equal) for g in gold_items] for p in pred_items]
    if _has_matching(table, lambda v: v is True):
        return True
    if not _has_matching(table, lambda v: v is not False):
        return False
    return None


def _has_matching(table: list[list[Verdict]], usable: Callable[[Verdict], bool]) -> bool:
    """Bipartite perfect matching (Kuhn's augmenting paths; sets here are small)."""
    match_of_gold: dict[int, int] = {}

    def augment(p: int, seen: set[int]) -> bool:
        for g, verdict in enumerate(table[p]):
            if usable(verdict) and g not in seen:
                seen.add(g)
                if g not in match_of_gold or augment(match_of_gold[g], seen):
                    match_of_gold[g] = p
                    return True
        return False

    return all(augment(p, set()) for p in range(len(table)))


MAX_MATRIX_ENTRY_NODES = 20_000  # size guard on the entries a sum or product of symbolic matrices builds


def _matrix_value(node: tuple) -> tuple:
    """A sum, product or negation of matrices as the matrix it is: [[1,2],[3,4]] + [[5,6],[7,8]] is [[6,8],[10,12]].

    Exact entries are computed as fractions; other entries become add/mul trees for the scalar test. Shapes
    that do not fit, a scalar added to a matrix, or a result too large leave the node as written (no value).
    """
    kind = node[0]
    if kind == "neg":
        inner = _matrix_value(node[1])
        return _map_entries(inner, lambda x: ("neg", x)) if inner[0] == "matrix" else node
    if kind not in ("add", "mul") or not _has_matrix(node):
        return node
    parts = [_matrix_value(part) for part in node[1]]
    if kind == "add":
        if any(part[0] != "matrix" for part in parts) or len({_shape(part) for part in parts}) != 1:
            return node
        rows, cols = _shape(parts[0])
        return _matrix_of(
            [[_sum([part[1][r][c] for part in parts]) for c in range(cols)] for r in range(rows)], node
        )
    value = parts[0]
    for part in parts[1:]:
        if value[0] == "matrix" and part[0] == "matrix":
            (m, k), (k2, n) = _shape(value), _shape(part)
            if k != k2 or n * _size(value) + m * _size(part) > MAX_MATRIX_ENTRY_NODES:
                return node
            value = _matrix_of(
                [[_sum([_product(value[1][r][i], part[1][i][c]) for i in range(k)]) for c in range(n)] for r in range(m)],
                node,
            )
        elif value[0] == "matrix" or part[0] == "matrix":
            matrix, scalar = (value, part) if value[0] == "matrix" else (part, value)
            if not is_scalar(scalar):
                return node
            value = _map_entries(matrix, lambda x, scalar=scalar: _product(scalar, x))
        else:
            value = ("mul", (value, part))
        if value[0] == "mul" and not is_scalar(value):
            return node
    return value


def _has_matrix(node: tuple) -> bool:
    kind = node[0]
    if kind == "matrix":
        return True
    if kind in ("add", "mul"):
        return any(_has_matrix(part) for part in node[1])
    return kind == "neg" and _has_matrix(node[1])


def _shape(matrix: tuple) -> tuple[int, int]:
    return len(matrix[1]), len(matrix[1][0])


def _size(matrix: tuple) -> int:
    """Nodes in a matrix's entries (bounded by the guard that built it)."""

    def count(node) -> int:
        return 1 + sum(count(part) for part in node if isinstance(part, tuple)) if isinstance(node, tuple) else 0

    return sum(count(entry) for row in matrix[1] for entry in row)


def _map_entries(matrix: tuple, function) -> tuple:
    return ("matrix", tuple(tuple(function(entry) for entry in row) for row in matrix[1]))


def _matrix_of(rows: list[list[tuple]], written: tuple) -> tuple:
    matrix = ("matrix", tuple(tuple(row) for row in rows))
    return matrix if _size(matrix) <= MAX_MATRIX_ENTRY_NODES else written


def _exact_or_none(node: tuple) -> Fraction | None:
    try:
        return exact_value(node)
    except TooLarge:
        return None


def _sum(terms: list[tuple]) -> tuple:
    values = [_exact_or_none(term) for term in terms]
    if all(value is not None for value in values):
        return ("num", sum(values, Fraction(0)), None)
    return terms[0] if len(terms) == 1 else ("add", tuple(terms))


def _product(a: tuple, b: tuple) -> tuple:
    x, y = _exact_or_none(a), _exact_or_none(b)
    if x is not None and y is not None:
        return ("num", x * y, None)
    return ("mul", (a, b))
