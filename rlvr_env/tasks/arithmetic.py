"""rlvr/Arithmetic-v0: procedural integer arithmetic with difficulty knobs."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from rlvr_env.answers import AnswerTask, validate_answer_weights
from rlvr_env.prompting import validate_few_shot_keep, validate_prompt_variants, worded_template
from rlvr_env.task import Problem, TaskConfig, validate_flags, validate_prompt_template

OPERATORS = "+-*/"


@dataclass
class ArithmeticConfig(TaskConfig):
    """Difficulty: ``digits`` per operand, ``terms`` operands, ``operators`` drawn
    uniformly from this string (a subset of "+-*/"; "/" always divides exactly).
    Reward: ``correct_weight`` for the right value (extracted from ``\\boxed``/"answer
    is", else the last number when ``fallback_last_number``) plus ``format_weight``
    for filling ``\\boxed{}`` (defaults sum to 1.0, so a perfect answer scores 1.0;
    a base model gets signal from the last-number fallback before it learns ``\\boxed{}``).
    ``few_shot_keep``: the chance each ``few_shot`` example is shown in a prompt (1 = all, 0 = zero-shot),
    drawn per problem (rlvr_env.prompting.shown_few_shot); a trainer's ``env.schedule`` fades it out.
    ``kinds``: a mix of question kinds, e.g. ``[{"operators": "+"}, {"terms": 3, "operators": "+-"}]``; each problem
    draws one uniformly (seeded per index) and takes its ``digits``/``terms``/``operators``, the fields above where
    it leaves one out. Empty (the default): every problem is of the one kind the fields describe."""

    digits: int = 2
    terms: int = 2
    operators: str = "+"
    prompt_template: str = "What is {expression}? Put your final answer within \\boxed{{}}."
    correct_weight: float = 0.9
    format_weight: float = 0.1
    fallback_last_number: bool = True
    literal_answer: bool = True  # the value as a number: "86 + 67" or \frac{306}{2} for 153 scores 0
    boxed_only: bool = False  # only a \boxed{} answer counts ("The answer is 5", a bare "5" and the last number score 0)
    few_shot_keep: float = 1.0  # chance each few-shot example is shown (per problem): 1 = all, 0 = none
    kinds: list[dict[str, Any]] = field(default_factory=list)  # a mix of {digits, terms, operators}; empty: the above
    # gold completions (a warm start's demonstrations) work each operation by place value: "87 - 23 = 87 - 20 - 3 =
    # 67 - 3 = 64", products as partial products; False: the expression and its value in one line
    worked_solutions: bool = False
    # Other wordings of the question (prompt templates with {expression}), and the chance each problem is asked in one
    # of them instead of prompt_template (drawn per problem, apart from its numbers): RL over several wordings, e.g.
    # env.schedule raising the chance after a warm start on prompt_template alone
    prompt_variants: list[str] = field(default_factory=list)
    prompt_variant_chance: float = 0.0

    def validate(self) -> None:
        super().validate()
        validate_shape(self.digits, self.terms, self.operators, "")
        if not isinstance(self.kinds, list):
            raise ValueError(f"kinds must be a list of {{digits, terms, operators}} tables, got {self.kinds!r}")
        for i, kind in enumerate(self.kinds):
            if not isinstance(kind, dict) or not kind or set(kind) - set(KIND_FIELDS):
                raise ValueError(f"kinds[{i}] must be a table of some of {KIND_FIELDS}, got {kind!r}")
            validate_shape(*self.kind_shape(kind), f"kinds[{i}].")
        validate_prompt_template(self.prompt_template, "expression")
        validate_answer_weights(self.correct_weight, self.format_weight)
        validate_flags(fallback_last_number=self.fallback_last_number, literal_answer=self.literal_answer,
                       boxed_only=self.boxed_only, worked_solutions=self.worked_solutions)
        validate_few_shot_keep(self.few_shot_keep)
        validate_prompt_variants(self.prompt_variants, self.prompt_variant_chance, "expression")

    def kind_shape(self, kind: dict[str, Any]) -> tuple[Any, Any, Any]:
        """(digits, terms, operators) of one of ``kinds``: its own values, the config's where it leaves one out."""
        return tuple(kind.get(name, getattr(self, name)) for name in KIND_FIELDS)


KIND_FIELDS = ("digits", "terms", "operators")


def validate_shape(digits: Any, terms: Any, operators: Any, where: str) -> None:
    """Reject a question shape, naming the field (``where`` prefixes it: "kinds[1].")."""
    if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= 9:
        raise ValueError(f"{where}digits must be an integer in 1..9, got {digits!r}")
    if isinstance(terms, bool) or not isinstance(terms, int) or not 2 <= terms <= 10:
        raise ValueError(f"{where}terms must be an integer in 2..10, got {terms!r}")
    if not operators or not isinstance(operators, str) or set(operators) - set(OPERATORS):
        raise ValueError(f"{where}operators must be a non-empty string of characters from {OPERATORS!r}, got {operators!r}")


def prime_factors(n: int) -> Counter:
    """The prime factorisation of ``n`` by trial division (fast for operands of up to 9 digits); empty for 0 and 1."""
    factors: Counter = Counter()
    candidate = 2
    while candidate * candidate <= n:
        while n % candidate == 0:
            factors[candidate] += 1
            n //= candidate
        candidate += 1 if candidate == 2 else 2
    if n > 1:
        factors[n] += 1
    return factors


def divisors_between(factors: Counter, low: int, high: int) -> list[int]:
    """The divisors in ``low..high`` of the number with prime factorisation ``factors``, ascending."""
    divisors = [1]
    for prime, exponent in factors.items():
        multiples = []
        for divisor in divisors:
            for _ in range(exponent + 1):
                if divisor > high:
                    break
                multiples.append(divisor)
                divisor *= prime
        divisors = multiples
    return sorted(d for d in divisors if d >= low)


def place_parts(n: int) -> list[int]:
    """The non-zero place values of ``n >= 0``, largest first: 347 -> [300, 40, 7], 305 -> [300, 5], 0 -> [0]."""
    digits = str(n)
    parts = [int(d) * 10 ** (len(digits) - 1 - i) for i, d in enumerate(digits) if d != "0"]
    return parts or [0]


def place_value_forms(a: int, op: str, b: int) -> list[str]:
    """The forms ``a op b`` (both >= 0, and ``a >= b`` for "-") passes through when ``b`` is taken one place at a
    time, ending with the value: (87, "-", 23) -> ["87 - 20 - 3", "67 - 3", "64"]; ``a op b`` itself left out."""
    forms, running, parts = [], a, place_parts(b)
    for i, part in enumerate(parts):
        forms.append(" ".join([str(running)] + [f"{op} {p}" for p in parts[i:]]))
        running = running + part if op == "+" else running - part
    return [form for form in forms if form != f"{a} {op} {b}"] + [str(running)]


def worked_sum(a: int, op: str, b: int) -> tuple[str, int]:
    """One + or - step worked on non-negative numbers: a running value ``a`` of any sign, an operand ``b >= 0``."""
    value, lhs = (a + b if op == "+" else a - b), f"{a} {op} {b}"
    if a >= 0 and (op == "+" or a >= b):
        return " = ".join([lhs, *place_value_forms(a, op, b)]), value
    if value >= 0:  # -m + b with b >= m: plainly b - m
        return " = ".join([lhs, f"{b} - {-a}", *place_value_forms(b, "-", -a)]), value
    # a negative result is worked as the negation of a sum or difference that is not
    if a >= 0:  # a - b with a < b: -(b - a)
        x, inner_op, y = b, "-", a
    elif op == "-":  # -m - b: -(m + b)
        x, inner_op, y = -a, "+", b
    else:  # -m + b with b < m: -(m - b)
        x, inner_op, y = -a, "-", b
    forms = place_value_forms(x, inner_op, y)
    return " = ".join([lhs, f"-({x} {inner_op} {y})", *[f"-({f})" for f in forms[:-1]], f"-{forms[-1]}"]), value


def worked_product(a: int, op: str, b: int) -> tuple[str, int]:
    """One * or / step on ``a, b >= 0``: a product of several places as its partial products, then their running
    sum (95 * 87 = 90 * 80 + 90 * 7 + 5 * 80 + 5 * 7 = 7200 + 630 + 400 + 35 = 7830 + 400 + 35 = ...)."""
    if op == "/":
        return f"{a} / {b} = {a // b}", a // b
    pairs = [(x, y) for x in place_parts(a) for y in place_parts(b)]
    if len(pairs) == 1 or 0 in (a, b):
        return f"{a} * {b} = {a * b}", a * b
    products = [x * y for x, y in pairs]
    forms = [f"{a} * {b}", " + ".join(f"{x} * {y}" for x, y in pairs)]
    for i in range(len(products) - 1):
        forms.append(" + ".join(str(p) for p in [sum(products[: i + 1]), *products[i + 1:]]))
    return " = ".join(forms + [str(a * b)]), a * b


def worked_solution(expression: str) -> tuple[str, int]:
    """``expression`` (ArithmeticTask's "n op n op n ...") worked a sentence per operation, products and quotients
    first, then the sums left to right; returns the text and the value."""
    tokens = expression.split()
    numbers, ops = [int(t) for t in tokens[::2]], tokens[1::2]
    sentences, chain_values, sum_ops = [], [numbers[0]], []
    for op, number in zip(ops, numbers[1:]):
        if op in "*/":
            sentence, chain_values[-1] = worked_product(chain_values[-1], op, number)
            sentences.append(sentence)
        else:
            chain_values.append(number)
            sum_ops.append(op)
    value = chain_values[0]
    for op, number in zip(sum_ops, chain_values[1:]):
        sentence, value = worked_sum(value, op, number)
        sentences.append(sentence)
    return ". ".join(sentences), value


class ArithmeticTask(AnswerTask):
    config_cls = ArithmeticConfig

    def problem(self, index: int, seed: int) -> Problem:
        cfg = self.config
        rng = np.random.default_rng([seed, index])
        # a mix draws its kind first; without one no draw is made, so a config's problems never change
        digits, terms, operators = cfg.kind_shape(cfg.kinds[int(rng.integers(len(cfg.kinds)))] if cfg.kinds else {})
        low, high = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1
        ops = [operators[i] for i in rng.integers(0, len(operators), size=terms - 1)]
        numbers = [int(rng.integers(low, high + 1))]
        # Evaluate with precedence as we go: `total` holds the finished +/- part,
        # `product` the running */ chain; a "/" picks a divisor of that chain so it divides exactly.
        # The chain is also kept factorised: scanning every d-digit candidate divisor takes minutes for 9 digits.
        total, product, sign = Fraction(0), Fraction(numbers[0]), 1
        chain_factors = prime_factors(numbers[0])
        for i, op in enumerate(ops):
            if op == "/":
                if product:
                    divisors = divisors_between(chain_factors, max(low, 1), high)
                else:  # every candidate divides 0
                    divisors = list(range(max(low, 1), high + 1))
                if divisors:
                    number = divisors[int(rng.integers(0, len(divisors)))]
                    product /= number
                    chain_factors -= prime_factors(number)
                else:  # e.g. a prime chain value with fewer digits than an operand: multiply instead
                    op, ops[i] = "*", "*"
            if op != "/":
                number = int(rng.integers(low, high + 1))
                if op == "*":
                    product *= number
                    chain_factors += prime_factors(number)
                else:
                    total += sign * product
                    product, sign = Fraction(number), (1 if op == "+" else -1)
                    chain_factors = prime_factors(number)
            numbers.append(number)
        value = total + sign * product
        expression = " ".join([str(numbers[0])] + [f"{op} {n}" for op, n in zip(ops, numbers[1:])])
        return Problem(
            prompt=worded_template(cfg.prompt_template, cfg.prompt_variants, cfg.prompt_variant_chance, seed,
                                   index).format(expression=expression),
            answer=str(int(value)),
            metadata={"index": index, "expression": expression, "digits": digits, "terms": terms},
        )

    def gold_completion(self, problem: Problem) -> str:
        expression, answer = problem.metadata["expression"], problem.answer
        working = worked_solution(expression)[0] if self.config.worked_solutions else f"{expression} = {answer}"
        return f"{working}, so the answer is \\boxed{{{answer}}}."

    def curriculum_levels(self) -> list[dict[str, Any]]:
        return [
            {"digits": 1, "terms": 2},
            {"digits": 2, "terms": 2},
            {"digits": 2, "terms": 3},
            {"digits": 3, "terms": 3},
            {"digits": 3, "terms": 4},
        ]
