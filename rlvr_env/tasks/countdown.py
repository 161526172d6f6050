"""rlvr/Countdown-v0: reach a target from given numbers with + - * / and parentheses.

The completion's expression is parsed with :mod:`ast` (a parser, nothing is
executed) and evaluated over exact fractions on a whitelist of node types.

Opt-in process rewards (``step_reward > 0``): each line of working such as
``44 + 19 = 63`` earns ``step_reward`` when it is a true equation over numbers
still available (the given ones, plus results of earlier valid lines, each used
once). Every valid line consumes at least two numbers and adds one, so a
completion earns at most ``(num_numbers - 1) * step_reward``.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

import rewards
from rewards.result import NO_ANSWER, OK, VerifyResult
from rlvr_env.task import Problem, Task, TaskConfig, validate_flags, validate_prompt_template

_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
# Only what an arithmetic expression needs; anything else is rejected before parsing.
_ALLOWED_CHARS = re.compile(r"[\d\s+\-*/().]*")
MAX_EXPRESSION_CHARS = 200
# A line of working ends in "<expression> = <integer>"; text before the expression ("Step 1:") is ignored.
# The line is split on its last "=" and each side matched on its own: one regex over the whole line
# backtracks for seconds on a long line of digits. An expression of at most MAX_EXPRESSION_CHARS has
# a value of at most that many digits, so a longer result is wrong (and int() would refuse it).
_NOT_EXPRESSION_CHAR = re.compile(r"[^\d\s+\-*/().]")
_WORKING_RESULT = re.compile(rf"(-?\d{{1,{MAX_EXPRESSION_CHARS}}})\s*\.?")


class ExpressionError(ValueError):
    """The completion's expression is not a plain arithmetic expression."""


def evaluate_expression(expression: str) -> tuple[Fraction, list[int]]:
    """Exact value of an arithmetic expression and the integer literals it uses.
    Raises ExpressionError for anything but numbers, + - * /, unary minus, parentheses."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    if not _ALLOWED_CHARS.fullmatch(expression):
        raise ExpressionError("expression may only contain digits, + - * /, parentheses")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, RecursionError, MemoryError) as error:
        raise ExpressionError(f"not an expression: {error}") from None
    numbers: list[int] = []

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if right == 0:
                raise ExpressionError("division by zero")
            return left / right
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            numbers.append(node.value)
            return Fraction(node.value)
        raise ExpressionError(f"unsupported element {type(node).__name__}")

    return value(tree.body), numbers


def apply_working_line(line: str, available: Counter) -> bool:
    """Whether ``line`` ends in a true ``expression = value`` over at least two numbers in
    ``available``; if so, those numbers are used up and ``value`` becomes available."""
    left, equals, right = line.rpartition("=")
    result = _WORKING_RESULT.fullmatch(right.strip())
    if not equals or result is None:
        return False
    expression = _NOT_EXPRESSION_CHAR.split(left)[-1]  # "Step 1: 44 + 19 " -> " 44 + 19 "
    try:
        value, used = evaluate_expression(expression)
    except ExpressionError:
        return False
    used_counts, claimed = Counter(used), int(result.group(1))
    if len(used) < 2 or used_counts - available or value != claimed:
        return False
    available -= used_counts
    available[claimed] += 1
    return True


@dataclass(frozen=True)
class CountdownVerifier:
    """1.0 when the extracted expression uses the given numbers (each at most as
    often as given; all of them when ``use_all_numbers``) and equals the target."""

    use_all_numbers: bool = True
    in_process_safe = True  # expressions are capped at MAX_EXPRESSION_CHARS, so evaluation is bounded

    def __call__(self, completion: str, *, answer: Any, **info: Any) -> VerifyResult:
        extracted = rewards.extract_answer(completion)
        if extracted is None:
            return VerifyResult(0.0, NO_ANSWER)
        expression = extracted.split("=")[0]  # "3 * 8 = 24" -> the left side
        try:
            result, used = evaluate_expression(expression)
        except ExpressionError as error:  # checked and wrong: not an arithmetic expression
            return VerifyResult(0.0, OK, {"extracted": extracted, "reason": str(error)})
        given, used_counts = Counter(answer["numbers"]), Counter(used)
        numbers_ok = used_counts == given if self.use_all_numbers else not (used_counts - given)
        correct = numbers_ok and result == answer["target"]
        return VerifyResult(float(correct), OK, {"extracted": extracted, "value": str(result), "numbers_ok": numbers_ok})


@dataclass
class CountdownConfig(TaskConfig):
    """``num_numbers`` numbers in ``1..max_number``; the target is the value of a random
    expression over all of them (every intermediate a positive integer, at most
    ``max_target``), so each problem is solvable. ``use_all_numbers`` as in TinyZero."""

    num_numbers: int = 4
    max_number: int = 99
    max_target: int = 1000
    use_all_numbers: bool = True
    step_reward: float = 0.0  # process reward per valid line of working; 0 = outcome reward only
    prompt_template: str = (
        "Using the numbers {numbers}, create an equation that equals {target}. "
        "You can use + - * / and parentheses, and each number {usage}. "
        "Put the expression alone inside \\boxed{{}}, e.g. \\boxed{{(1 + 2) * 3}}."
    )

    def validate(self) -> None:
        super().validate()
        if not isinstance(self.num_numbers, int) or not 2 <= self.num_numbers <= 8:
            raise ValueError(f"num_numbers must be an integer in 2..8, got {self.num_numbers!r}")
        if not isinstance(self.max_number, int) or self.max_number < 2:
            raise ValueError(f"max_number must be an integer >= 2, got {self.max_number!r}")
        if not isinstance(self.max_target, int) or self.max_target < 1:
            raise ValueError(f"max_target must be a positive integer, got {self.max_target!r}")
        validate_flags(use_all_numbers=self.use_all_numbers)
        step_reward_is_number = isinstance(self.step_reward, (int, float)) and not isinstance(self.step_reward, bool)
        if not step_reward_is_number or not 0 <= self.step_reward <= 1:
            raise ValueError(f"step_reward must be a number in [0, 1], got {self.step_reward!r}")
        validate_prompt_template(self.prompt_template, "numbers", "target", optional=("usage",))


class CountdownTask(Task):
    config_cls = CountdownConfig
    _MAX_ATTEMPTS = 200

    def problem(self, index: int, seed: int) -> Problem:
        cfg = self.config
        rng = np.random.default_rng([seed, index])
        for _ in range(self._MAX_ATTEMPTS):
            numbers = [int(n) for n in rng.integers(1, cfg.max_number + 1, size=cfg.num_numbers)]
            solution = self._random_solution(numbers, rng)
            if solution is not None:
                break
        else:  # the sum is always a solution, though it may pass max_target
            solution = (" + ".join(map(str, numbers)), sum(numbers))
        expression, target = solution
        usage = "must be used exactly once" if cfg.use_all_numbers else "can be used at most once"
        return Problem(
            prompt=cfg.prompt_template.format(numbers=numbers, target=target, usage=usage),
            answer={"target": target, "numbers": numbers},
            metadata={"index": index, "solution": expression},
        )

    def _random_solution(self, numbers: list[int], rng: np.random.Generator) -> tuple[str, int] | None:
        """Combine random pairs until one value is left; None if a step leaves the positive integers."""
        items = [(str(n), n) for n in numbers]
        while len(items) > 1:
            i, j = rng.choice(len(items), size=2, replace=False)
            (left, a), (right, b) = items[i], items[j]
            op = "+-*/"[int(rng.integers(0, 4))]
            if op == "-" and a <= b or op == "/" and a % b:
                return None
            combined = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
            items = [item for k, item in enumerate(items) if k not in (i, j)] + [(f"({left} {op} {right})", combined)]
        expression, target = items[0]
        if target > self.config.max_target:
            return None
        return expression[1:-1], target  # the last combination's parentheses wrap everything

    @property
    def verifier(self):
        return rewards.WeightedSum([("correct", CountdownVerifier(self.config.use_all_numbers), 1.0)])

    def gold_completion(self, problem: Problem) -> str:
        return f"\\boxed{{{problem.metadata['solution']}}}"

    @property
    def process_step_end(self) -> str | None:
        return "\n" if self.config.step_reward > 0 else None

    def process_reward(self, problem: Problem, text_so_far: str) -> float:
        """``step_reward`` when the last line of ``text_so_far`` is a valid line of working."""
        available = Counter(problem.answer["numbers"])
        lines = [line for line in text_so_far.splitlines() if line.strip()]
        valid = False
        for line in lines:  # earlier lines decide which numbers the last one may use
            valid = apply_working_line(line, available)
        return float(self.config.step_reward) if valid else 0.0

    def curriculum_levels(self) -> list[dict[str, Any]]:
        return [{"num_numbers": n} for n in (3, 4, 5, 6)]
