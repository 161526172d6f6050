"""rlvr/Countdown-v0 in detail: the expression evaluator, the problems it draws, the verifier's rows, the process
reward's bookkeeping of numbers, and the config's bounds (tests/test_tasks.py has the overview)."""

import ast
import re
from collections import Counter
from fractions import Fraction

import pytest

import rlvr_env
from rewards import VerifyResult
from rlvr_env.tasks.countdown import (
    MAX_EXPRESSION_CHARS,
    CountdownVerifier,
    ExpressionError,
    apply_working_line,
    evaluate_expression,
)


@pytest.mark.parametrize("expression, value, numbers", [
    ("3 + 4 * 2", 11, [3, 4, 2]),
    ("-3 + 5", 2, [3, 5]),  # unary minus
    ("-(2 - 7)", 5, [2, 7]),
    ("(8 - 2) / 4", Fraction(3, 2), [8, 2, 4]),
])
def test_an_expression_has_its_exact_value_and_its_numbers(expression, value, numbers):
    assert evaluate_expression(expression) == (value, numbers)


@pytest.mark.parametrize("expression, message", [
    ("x + 1", "expression may only contain digits, + - * /, parentheses"),
    ("3 ** 2", "unsupported element BinOp"),
    ("1.5 + 2", "unsupported element Constant"),
    ("+3", "unsupported element UnaryOp"),
    ("3 / (2 - 2)", "division by zero"),
    ("3 +", "not an expression: "),
    ("1+" * 100 + "1", f"expression longer than {MAX_EXPRESSION_CHARS} characters"),
])
def test_anything_else_is_refused_saying_why(expression, message):
    with pytest.raises(ExpressionError) as refused:
        evaluate_expression(expression)
    assert str(refused.value).startswith(message), str(refused.value)


def test_an_expression_of_the_longest_length_is_evaluated():
    expression = "1+" * 99 + "11"
    assert len(expression) == MAX_EXPRESSION_CHARS and evaluate_expression(expression)[0] == 110


def test_a_line_of_working_uses_up_its_numbers_and_makes_its_result_available():
    available = Counter([44, 19, 5])
    assert apply_working_line("Step 1: 44 + 19 = 63", available) and available == Counter([5, 63])
    assert apply_working_line("63 - 5 = 58.", available) and available == Counter([58])
    for wrong in ("58 + 58 = 116",  # 58 once only
                  "58 = 58",  # one number
                  "58 - 0 = 57",  # false, and 0 is not available
                  "58 + 1",  # no result
                  "58 + 1 = x",  # no number after "="
                  "58 ** 2 = 3364"):  # not arithmetic of the task
        assert not apply_working_line(wrong, available) and available == Counter([58])
    available = Counter([44, 19])
    assert apply_working_line("Let x=1: 44 + 19 = 63", available)  # the last "=" ends the line's equation
    assert available == Counter([63])
    available = Counter([5, 3, 2])
    assert apply_working_line("3 + 2 = 5", available) and available == Counter({5: 2})  # a second 5


def test_the_process_reward_pays_the_last_line_only_when_it_is_valid_working():
    task = rlvr_env.make_task("Countdown", step_reward=0.25)
    problem = task.problem(0, 0)
    problem = type(problem)(prompt=problem.prompt, answer={"target": 58, "numbers": [44, 19, 5]}, metadata=problem.metadata)
    assert task.process_step_end == "\n" and rlvr_env.make_task("Countdown").process_step_end is None
    assert task.process_reward(problem, "") == 0.0
    assert task.process_reward(problem, "44 + 19 = 63\n") == 0.25
    assert task.process_reward(problem, "44 + 19 = 63\n63 - 5 = 58\n") == 0.25
    assert task.process_reward(problem, "44 + 19 = 63\n44 + 5 = 49\n") == 0.0  # 44 is used up
    assert task.process_reward(problem, "44 + 19 = 63\nso far so good\n") == 0.0


def test_the_verifier_says_what_it_read_and_why_it_scored():
    answer = {"target": 24, "numbers": [3, 8, 1]}
    strict, lenient = CountdownVerifier(), CountdownVerifier(use_all_numbers=False)
    assert strict("I give up.\nNo idea.", answer=answer) == VerifyResult(0.0, "no_answer")
    assert strict("\\boxed{3 ** 8}", answer=answer) == VerifyResult(
        0.0, "ok", {"extracted": "3 ** 8", "reason": "unsupported element BinOp"})
    assert strict("\\boxed{3 * 8 * 1 = 24}", answer=answer) == VerifyResult(
        1.0, "ok", {"extracted": "3 * 8 * 1 = 24", "value": "24", "numbers_ok": True})
    assert strict("\\boxed{3 * 8}", answer=answer) == VerifyResult(
        0.0, "ok", {"extracted": "3 * 8", "value": "24", "numbers_ok": False})
    assert lenient("\\boxed{3 * 8}", answer=answer).score == 1.0
    assert lenient("\\boxed{3 * 8 * 1 * 1}", answer=answer).details["numbers_ok"] is False


def _intermediates(expression: str) -> list[Fraction]:
    """The value of every operation in the expression, each by the task's own evaluator."""
    tree = ast.parse(expression, mode="eval")
    return [evaluate_expression(ast.unparse(node))[0] for node in ast.walk(tree) if isinstance(node, ast.BinOp)]


@pytest.mark.parametrize("kwargs", [{}, {"num_numbers": 2, "max_number": 9, "max_target": 10},
                                    {"num_numbers": 3, "max_number": 2, "max_target": 1},
                                    {"num_numbers": 8, "max_number": 99, "max_target": 1}])
def test_each_problem_is_solvable_by_its_solution_over_positive_integers(kwargs):
    task = rlvr_env.make_task("Countdown", **kwargs)
    config = task.config
    targets, drawn, operators, fallbacks = [], Counter(), set(), 0
    for index in range(200):
        problem = task.problem(index, seed=7)
        numbers, target, solution = problem.answer["numbers"], problem.answer["target"], problem.metadata["solution"]
        assert problem.metadata["index"] == index and type(target) is int
        assert len(numbers) == config.num_numbers and all(1 <= n <= config.max_number for n in numbers)
        value, used = evaluate_expression(solution)
        assert value == target and Counter(used) == Counter(numbers)
        fallback = solution == " + ".join(map(str, numbers))  # no drawn solution within bounds: the sum
        fallbacks += fallback
        if not fallback:  # a drawn solution: every step a positive integer, the target within bounds
            assert all(v > 0 and v.denominator == 1 for v in _intermediates(solution))
            assert target <= config.max_target
            operators |= set(re.findall(r"[-+*/]", solution))
        targets.append(target)
        drawn.update(numbers)
        assert f"Using the numbers {numbers}, create an equation that equals {target}." in problem.prompt
        assert "each number must be used exactly once" in problem.prompt
    if config.max_number < 50:
        assert set(drawn) == set(range(1, config.max_number + 1))  # both ends of 1..max_number are drawn
    if config.num_numbers == 8:
        assert fallbacks > 0  # eight numbers rarely combine to 1: the sum stands in
    if config.max_target == 10:
        assert max(targets) == 10 and operators == set("+-*/")  # the bound itself is reachable; every operator
    lenient = rlvr_env.make_task("Countdown", use_all_numbers=False, **kwargs)
    assert "each number can be used at most once" in lenient.problem(0, seed=7).prompt


@pytest.mark.parametrize("key, accepted, refused, message", [
    ("num_numbers", (2, 8), (1, 9, "4"), "num_numbers must be an integer in 2..8, got {!r}"),
    ("max_number", (2,), (1, 2.0), "max_number must be an integer >= 2, got {!r}"),
    ("max_target", (1,), (0, 10.0), "max_target must be a positive integer, got {!r}"),
    ("step_reward", (0, 1), (-0.1, 1.01, True), "step_reward must be a number in [0, 1], got {!r}"),
])
def test_the_config_takes_its_edges_and_names_the_key_past_them(key, accepted, refused, message):
    for value in accepted:
        assert getattr(rlvr_env.make_task("Countdown", **{key: value}).config, key) == value
    for value in refused:
        with pytest.raises(ValueError, match=re.escape(message.format(value))):
            rlvr_env.make_task("Countdown", **{key: value})


def test_the_curriculum_adds_numbers_level_by_level():
    levels = rlvr_env.make_task("Countdown").curriculum_levels()
    assert levels == [{"num_numbers": n} for n in (3, 4, 5, 6)]
    assert [rlvr_env.make_task("Countdown", **level).config.num_numbers for level in levels] == [3, 4, 5, 6]
