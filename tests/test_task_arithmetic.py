"""rlvr/Arithmetic-v0 in detail: the number theory behind its exact divisions, the shape's bounds, the gold
completions a warm start imitates, its problems' metadata and its curriculum (tests/test_tasks.py has the overview)."""

import math
import re
from collections import Counter

import pytest

import rlvr_env
from rlvr_env.tasks.arithmetic import divisors_between, prime_factors


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, math.isqrt(n) + 1))


def test_prime_factors_multiply_back_to_the_number_and_are_prime():
    assert prime_factors(0) == Counter() and prime_factors(1) == Counter()
    for n in range(2, 400):
        factors = prime_factors(n)
        assert math.prod(p ** k for p, k in factors.items()) == n and all(map(_is_prime, factors)), n
    assert prime_factors(2) == Counter({2: 1}) and prime_factors(9) == Counter({3: 2})  # a prime, a square
    assert prime_factors(2 * 3 * 5 * 7 * 11 * 13 * 999_983) == Counter([2, 3, 5, 7, 11, 13, 999_983])


@pytest.mark.parametrize("n, low, high", [(36, 2, 12), (36, 1, 36), (36, 5, 8), (97, 1, 97), (360, 10, 40), (1, 1, 1)])
def test_divisors_between_are_every_divisor_in_the_closed_range(n, low, high):
    assert divisors_between(prime_factors(n), low, high) == [d for d in range(low, high + 1) if n % d == 0]


@pytest.mark.parametrize("kwargs, message", [
    ({"digits": 10}, "digits must be an integer in 1..9, got 10"),
    ({"terms": 11}, "terms must be an integer in 2..10, got 11"),
    ({"terms": "3"}, "terms must be an integer in 2..10, got '3'"),
    ({"operators": 5}, "operators must be a non-empty string of characters from '+-*/', got 5"),
    ({"kinds": [{"terms": 1}]}, "kinds[0].terms must be an integer in 2..10, got 1"),
    ({"kinds": [{}]}, "kinds[0] must be a table of some of ('digits', 'terms', 'operators'), got {}"),
    ({"prompt_variants": ["What is it?"], "prompt_variant_chance": 0.5}, "{expression}"),
])
def test_a_shape_past_its_bounds_is_refused_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        rlvr_env.make_task("Arithmetic", **kwargs)


def test_the_shapes_largest_values_are_accepted():
    task = rlvr_env.make_task("Arithmetic", digits=9, terms=10, operators="+-*/")
    problem = task.problem(0, 0)
    assert problem.metadata == {"index": 0, "expression": problem.metadata["expression"], "digits": 9, "terms": 10}
    assert len(problem.metadata["expression"].split()) == 19  # ten numbers, nine operators


@pytest.mark.parametrize("worked", [False, True])
def test_a_gold_completion_works_the_expression_and_scores_full_marks(worked):
    task = rlvr_env.make_task("Arithmetic", terms=3, operators="+-*", worked_solutions=worked)
    for index in range(20):
        problem = task.problem(index, 3)
        gold = task.gold_completion(problem)
        plain = f"{problem.metadata['expression']} = {problem.answer}, so the answer is \\boxed{{{problem.answer}}}."
        assert (gold == plain) is not worked and gold.endswith(f", so the answer is \\boxed{{{problem.answer}}}.")
        assert task.verifier(gold, answer=problem.answer).score == 1.0


def test_the_curriculum_grows_digits_then_terms():
    levels = rlvr_env.make_task("Arithmetic").curriculum_levels()
    assert levels == [{"digits": 1, "terms": 2}, {"digits": 2, "terms": 2}, {"digits": 2, "terms": 3},
                      {"digits": 3, "terms": 3}, {"digits": 3, "terms": 4}]
    for level in levels:
        metadata = rlvr_env.make_task("Arithmetic", **level).problem(0, 0).metadata
        assert (metadata["digits"], metadata["terms"]) == (level["digits"], level["terms"])
