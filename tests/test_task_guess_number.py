"""rlvr/GuessNumber-v0 piece by piece: its config's refusals, the secrets it draws, its replies and its verifier
(tests/test_env_multiturn.py plays whole episodes)."""

import math

import pytest

import rlvr_env
from rewards.result import NO_ANSWER, OK, VerifyResult
from rlvr_env.multiturn_env import Reply


@pytest.mark.parametrize("settings, message", [
    ({"low": True}, "low must be an integer of at most 12 digits, got True"),
    ({"low": 1.5}, "low must be an integer of at most 12 digits, got 1.5"),
    ({"low": -10**12}, "low must be an integer of at most 12 digits, got -1000000000000"),
    ({"high": 10**12}, "high must be an integer of at most 12 digits, got 1000000000000"),
    ({"wrong_guess_reward": True}, "wrong_guess_reward must be a finite number, got True"),
    ({"wrong_guess_reward": "-0.1"}, "wrong_guess_reward must be a finite number, got '-0.1'"),
    ({"wrong_guess_reward": math.inf}, "wrong_guess_reward must be a finite number, got inf"),
])
def test_a_bad_setting_is_refused_by_name(settings, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        rlvr_env.make_task("GuessNumber", **settings)


def test_the_widest_range_of_twelve_digits_is_accepted():
    task = rlvr_env.make_task("GuessNumber", low=-(10**12 - 1), high=10**12 - 1, wrong_guess_reward=-1)
    assert abs(int(task.problem(0, 0).answer)) < 10**12


def test_secrets_cover_the_range_ends_included_and_the_prompt_states_it():
    task = rlvr_env.make_task("GuessNumber", low=2, high=4, max_turns=3)
    problems = [task.problem(index, 7) for index in range(100)]
    assert {int(problem.answer) for problem in problems} == {2, 3, 4}
    assert [problem.metadata for problem in problems[:2]] == [{"index": 0}, {"index": 1}]
    assert problems[0].prompt == ("I am thinking of a whole number from 2 to 4. Guess it: write one guess per message "
                                  "as \\boxed{n}, and I will say whether my number is higher or lower. You have 3 "
                                  "guesses.")


def test_each_wrong_move_gets_the_configured_reward_and_the_right_guess_ends_the_game():
    task = rlvr_env.make_task("GuessNumber", wrong_guess_reward=-0.25)
    problem = task.problem(0, 0)
    secret = int(problem.answer)

    def reply(text):
        return task.reply(problem, [{"role": "user", "content": problem.prompt}, {"role": "assistant", "content": text}])

    assert reply("no guess") == Reply("Write your guess as \\boxed{n}.", -0.25)
    assert reply(f"\\boxed{{{secret - 1}}}") == Reply("Higher.", -0.25)
    assert reply(f"\\boxed{{{secret + 1}}}") == Reply("Lower.", -0.25)
    assert reply(f"\\boxed{{{secret + 1}}} no, \\boxed{{{secret}}}") is None  # the last guess counts


def test_the_verifier_scores_the_last_guess_and_reports_it():
    verifier = rlvr_env.make_task("GuessNumber").verifier
    assert verifier("I give up", answer="42") == VerifyResult(0.0, NO_ANSWER, {"components": {"correct": 0.0}})
    assert verifier("\\boxed{41}", answer="42") == VerifyResult(0.0, OK, {"guess": 41, "components": {"correct": 0.0}})
    assert verifier("\\boxed{ 42 }", answer="42") == VerifyResult(1.0, OK, {"guess": 42, "components": {"correct": 1.0}})
