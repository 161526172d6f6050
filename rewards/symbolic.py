"""Symbolic leaf test with sympy, built from our own trees (never from raw text).

Only the time-limited worker (sandbox.py) imports this module: sympy can hang in
C code on hostile input, and only a killable process bounds that.
"""

from __future__ import annotations

from fractions import Fraction

import sympy

from .compare import (
    MAX_FACTORIAL,
    MAX_RESULT_BITS,
    MIN_GOLD_ROUNDING_PLACES,
    TooLarge,
    Verdict,
    canonical,
    check_binom_size,
    decimal_places,
    exact_value,
    is_scalar,
    rationals_match,
    sample_points,
)

_CONSTANTS = {"pi": sympy.pi, "e": sympy.E, "i": sympy.I, "inf": sympy.oo}
_FUNCTIONS = {
    "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "cot": sympy.cot, "sec": sympy.sec, "csc": sympy.csc,
    "arcsin": sympy.asin, "arccos": sympy.acos, "arctan": sympy.atan, "sinh": sympy.sinh, "cosh": sympy.cosh,
    "tanh": sympy.tanh, "exp": sympy.exp, "ln": sympy.log, "sqrt": sympy.sqrt, "abs": sympy.Abs,
    "floor": sympy.floor, "ceil": sympy.ceiling,
}
_MAX_EXPONENT = 10_000


def to_sympy(node: tuple) -> sympy.Expr:
    """Sympy expression of a scalar tree; raises TooLarge before building anything huge."""
    kind = node[0]
    if kind == "num":
        return sympy.Rational(node[1].numerator, node[1].denominator)
    if kind == "sym":
        return sympy.Symbol(node[1], real=True)
    if kind == "const":
        return _CONSTANTS[node[1]]
    if kind == "neg":
        return -to_sympy(node[1])
    if kind == "add":
        return sympy.Add(*(to_sympy(p) for p in node[1]))
    if kind == "mul":
        return sympy.Mul(*(to_sympy(p) for p in node[1]))
    if kind == "div":
        return to_sympy(node[1]) / to_sympy(node[2])
    if kind == "pct":
        return to_sympy(node[1]) / 100
    if kind == "pow":
        exponent = to_sympy(node[2])
        if exponent.is_number and not exponent.has(sympy.oo) and abs(exponent.evalf(15)) > _MAX_EXPONENT:
            raise TooLarge("exponent too large")
        base = to_sympy(node[1])
        if base.is_number and exponent.is_number:
            size = abs(exponent.evalf(15)) * float(sympy.log(abs(base.evalf(15)) + 2, 2))
            if size > MAX_RESULT_BITS:
                raise TooLarge("power too large")
        return sympy.Pow(base, exponent)
    if kind == "fn":
        name, args = node[1], [to_sympy(a) for a in node[2]]
        if name == "factorial":
            if args[0].is_number and args[0] > MAX_FACTORIAL:
                raise TooLarge("factorial too large")
            return sympy.factorial(args[0])
        if name == "binom":
            _guard_binom(*args)
            return sympy.binomial(*args)
        if name in ("log", "lg"):
            base = args[1] if len(args) > 1 else (10 if name == "lg" else sympy.E)
            return sympy.log(args[0], base)
        if name in ("max", "min"):
            return (sympy.Max if name == "max" else sympy.Min)(*args)
        if name in ("gcd", "lcm"):
            if all(arg.is_Integer for arg in args):
                return (sympy.igcd if name == "gcd" else sympy.ilcm)(*args)
            return sympy.Function(name)(*args)  # of symbols: as written (sympy.gcd is the polynomials' gcd)
        return _FUNCTIONS[name](args[0])
    raise TypeError(f"not a scalar: {kind}")


def _guard_binom(n: sympy.Expr, k: sympy.Expr) -> None:
    """TooLarge before sympy evaluates (or later expands) a huge binomial: binom(10^9, 10^5) takes seconds."""
    if n.is_number and k.is_number:
        if n.is_Rational and k.is_Rational:
            check_binom_size(Fraction(int(n.p), int(n.q)), Fraction(int(k.p), int(k.q)))
        elif abs(n.evalf(15)) > MAX_FACTORIAL or abs(k.evalf(15)) > MAX_FACTORIAL:
            raise TooLarge("binomial too large")
    elif k.is_number and abs(k.evalf(15)) > MAX_FACTORIAL:  # binom(x, 10^5) expands to a huge product
        raise TooLarge("binomial too large")


def sympy_scalar_equal(pred: tuple, gold: tuple) -> Verdict:
    """Leaf test in the worker: exact first, then simplify(a - b) == 0, then a decimal-rounding check."""
    try:
        pred_value, gold_value = exact_value(pred), exact_value(gold)
    except TooLarge:
        pred_value = gold_value = None
    if pred_value is not None and gold_value is not None:
        return rationals_match(pred_value, gold_value, decimal_places(pred), decimal_places(gold))
    if not (is_scalar(pred) and is_scalar(gold)):  # 2(1,2), f(1,2): no value, only the same writing (as in-process)
        return canonical(pred) == canonical(gold)
    a, b = to_sympy(pred), to_sympy(gold)
    if a.has(sympy.zoo, sympy.nan) or b.has(sympy.zoo, sympy.nan):  # 1/0 is undefined, not a value: 1/0 != 2/0
        return False
    if a == b:
        return True
    if a.has(sympy.oo, -sympy.oo) or b.has(sympy.oo, -sympy.oo):
        return False
    if not (a.free_symbols or b.free_symbols):
        # a predicted decimal against an irrational gold (1.414 vs sqrt(2)): the decimal must be the gold rounded
        places, value = decimal_places(pred), exact_value(pred)
        if places is not None and value is not None:
            approx = b.evalf(places + 15)
            return bool(approx.is_real) and rationals_match(value, Fraction(str(approx)), places, None)
        # a decimal gold is taken as written unless computed to many places against an exact prediction
        # (4.123105625617661 vs sqrt(17)); see rationals_match
        places, value = decimal_places(gold), exact_value(gold)
        if places is not None and value is not None and places >= MIN_GOLD_ROUNDING_PLACES:
            approx = a.evalf(places + 15)
            return bool(approx.is_real) and rationals_match(Fraction(str(approx)), value, None, places)
    difference = a - b
    if _clearly_nonzero(difference):  # cheap rejection before simplify, which costs milliseconds
        return False
    if sympy.expand(difference) == 0:
        return True
    if sympy.simplify(difference) == 0:
        return True
    # simplify does not prove every identity of constants: log_2 6 against 1 + log_2 3 (it keeps log(6) whole) is left
    # as sin(log(6)/log(2)) - sin(1 + log(3)/log(2)). Two closed forms that agree to 40 significant digits are equal.
    return not difference.free_symbols and _agree_to_digits(a, b, EQUAL_CONSTANT_DIGITS)


# Closed forms that are not equal part far sooner: e^(pi sqrt(163)) is 262537412640768744 to 12 places only.
EQUAL_CONSTANT_DIGITS = 40


def _agree_to_digits(a: sympy.Expr, b: sympy.Expr, digits: int) -> bool:
    """Do two constant expressions agree to ``digits`` significant digits (evaluated to 20 more, in sympy's floats:
    Python's would lose e^{-1000} to 0 and call it equal to 2e^{-1000})?"""
    precision = digits + 20
    try:
        difference = abs((a - b).evalf(precision))
        magnitude = max(abs(a.evalf(precision)), abs(b.evalf(precision)))
        return bool(difference <= magnitude * sympy.Float(10, precision) ** -digits)
    except (TypeError, ValueError, ZeroDivisionError, OverflowError):  # no number to compare: not shown equal
        return False


def _clearly_nonzero(expr: sympy.Expr) -> bool:
    """True if expr evaluates far from zero at some sample point (then it is not identically zero)."""
    for point in sample_points(sorted(expr.free_symbols, key=lambda s: s.name)):
        values = {sym: sympy.Rational(v.numerator, v.denominator) for sym, v in point.items()}
        try:
            value = complex(expr.subs(values).evalf(30))
        except (TypeError, ValueError, ZeroDivisionError):
            continue
        if value == value and abs(value) > 1e-9 and abs(value) != float("inf"):
            return True
    return False
