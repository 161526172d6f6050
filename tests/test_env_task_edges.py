"""Task edge cases: hostile lines of working, large-digit division, literal answers with units, config types."""

import time
from collections import Counter
from fractions import Fraction  # noqa: F401 (the expressions the tests eval() build Fractions)

import pytest

import rlvr_env
from rewards.result import NO_ANSWER
from rlvr_env.answers import LenientAnswer
from rlvr_env.tasks.countdown import apply_working_line


@pytest.fixture(scope="module")
def countdown():
    task = rlvr_env.make_task("Countdown", step_reward=0.1)
    return task, task.problem(0, 0)


def test_countdown_long_line_without_equals_is_rejected_fast(countdown):
    task, problem = countdown
    start = time.perf_counter()
    assert task.process_reward(problem, "1" * 2000 + "\n") == 0.0  # took 18 s with one regex over the line
    assert time.perf_counter() - start < 0.5


def test_countdown_oversized_result_is_an_invalid_line_not_a_crash(countdown):
    task, problem = countdown
    a, b = problem.answer["numbers"][:2]
    huge = f"{a} + {b} = " + "9" * 5000  # beyond int()'s 4300-digit limit
    assert task.process_reward(problem, huge + "\n") == 0.0
    assert task.process_reward(problem, f"{huge}\n{a} + {b} = {a + b}\n") == 0.1  # later lines still count


def test_countdown_working_line_keeps_prefix_and_trailing_period_rules():
    assert apply_working_line("Step 2: (3 + 5) * 2 = 16 .", Counter([3, 5, 2]))
    assert not apply_working_line("3 + 5 = 8 = 9", Counter([3, 5]))
    assert not apply_working_line("3 + 5 = 8 apples", Counter([3, 5]))


@pytest.mark.parametrize("kwargs, message", [
    ({"use_all_numbers": "false"}, "use_all_numbers"),
    ({"step_reward": True}, "step_reward"),
    ({"prompt_template": "Reach {target}."}, r"prompt_template must contain \{numbers\}"),
    ({"prompt_template": "{numbers} {target} {hint}"}, "prompt_template must format with only"),
])
def test_countdown_config_errors_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        rlvr_env.make_task("Countdown", **kwargs)


def test_countdown_template_may_leave_out_the_usage_rule():
    task = rlvr_env.make_task("Countdown", prompt_template="Use {numbers} to make {target}.")
    assert task.messages(task.problem(0, 0))[-1]["content"].startswith("Use [")


def test_arithmetic_division_problems_are_unchanged():
    task = rlvr_env.make_task("Arithmetic", digits=4, terms=3, operators="*/")
    assert [task.problem(i, 0).metadata["expression"] for i in range(3)] == [
        "5600 / 1400 * 3770", "9936 / 2484 * 3726", "3582 / 1791 * 3061"]
    zero_chain = rlvr_env.make_task("Arithmetic", digits=1, terms=6, operators="*/").problem(0, 0)
    assert zero_chain.metadata["expression"] == "0 / 1 / 1 / 2 * 8 * 6"  # any digit divides 0


def test_arithmetic_division_with_nine_digits_is_fast_and_exact():
    task = rlvr_env.make_task("Arithmetic", digits=9, terms=6, operators="+*/")
    start = time.perf_counter()
    problems = [task.problem(i, 0) for i in range(5)]  # scanning 9-digit divisors took minutes per "/"
    assert time.perf_counter() - start < 0.5
    for problem in problems:
        tokens = problem.metadata["expression"].split()
        assert all(len(operand) == 9 for operand in tokens[::2])
        value = eval(" ".join(f"Fraction({t})" if t.isdigit() else t for t in tokens))
        assert value == int(problem.answer)


@pytest.mark.parametrize("completion,gold,score", [
    ("\\boxed{12 \\text{ m}^2}", "12", 1.0),
    ("\\boxed{10 \\mathrm{cm}^{2}}", "10", 1.0),
    ("\\boxed{45^\\circ}", "45", 1.0),
    ("\\boxed{3/4}", "3/4", 1.0),  # a gold written as a fraction accepts the same form
    ("\\boxed{86 + 67}", "153", 0.0),
    ("\\boxed{3 \\text{ m} \\times 4 \\text{ m}}", "12", 0.0),
])
def test_literal_answer_ignores_units_and_arithmetic_gold(completion, gold, score):
    assert LenientAnswer(fallback_last_number=True, literal_answer=True)(completion, answer=gold).score == score


@pytest.mark.parametrize("completion,default,boxed_only", [
    ("84 + 21 = 105", 1.0, 0.0),  # a short response read whole
    ("The answer is 105.", 1.0, 0.0),
    ("First 84 + 21 makes 105 and I stop here", 1.0, 0.0),  # the last-number fallback
    ("84 + 21 = 105. The answer is \\boxed{105}.", 1.0, 1.0),
    ("\\boxed{104} so it is 105", 0.0, 0.0),  # a box is the answer, the number after it is not
    ("The answer is \\boxed{84 + 21}.", 0.0, 0.0),  # literal_answer still applies
])
def test_boxed_only_counts_a_boxed_answer_alone(completion, default, boxed_only):
    for only, expected in ((False, default), (True, boxed_only)):
        task = rlvr_env.make_task("Arithmetic", boxed_only=only, format_weight=0.0, correct_weight=1.0)
        assert task.verifier(completion, answer="105").score == expected, (only, completion)
    if "boxed" not in completion:
        assert LenientAnswer(boxed_only=True)(completion, answer="105").status == NO_ANSWER


@pytest.mark.parametrize("field,value", [
    ("boxed_only", "true"), ("correct_weight", "0.9"), ("correct_weight", True), ("correct_weight", float("nan")),
    ("format_weight", None), ("format_weight", float("inf")),
    ("fallback_last_number", "false"), ("literal_answer", 0),
])
def test_arithmetic_config_types_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        rlvr_env.make_task("Arithmetic", **{field: value})


def test_reasoning_gym_nested_config_reaches_the_dataset():
    reasoning_gym = pytest.importorskip("reasoning_gym")
    config = {"rng_difficulty_ranges": [[0.0, 0.025], [0.025, 0.05]], "rng_difficulty_weights": [0.5, 0.5]}
    task = rlvr_env.make_task("rg.rearc", dataset_config=config, size=2)
    assert task.problem(1, 3).answer == reasoning_gym.create_dataset("rearc", seed=3, size=2, **config)[1]
    with pytest.raises(ValueError, match="dataset_config"):
        rlvr_env.make_task("rg.rearc", dataset_config={"rng_difficulty_weights": {0.5}})


def test_reasoning_gym_without_reference_answer_has_no_gold_completion():
    pytest.importorskip("reasoning_gym")
    task = rlvr_env.make_task("rg.rush_hour", size=2)
    with pytest.raises(NotImplementedError, match="rush_hour"):
        task.gold_completion(task.problem(0, 0))
