"""rlvr/GuessNumber-v0: find a secret number by guessing; the environment answers "higher" or "lower"."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from rewards.result import NO_ANSWER, OK, VerifyResult
from rlvr_env.multiturn_env import MultiTurnConfig, MultiTurnTask, Reply
from rlvr_env.task import Problem, validate_prompt_template

_GUESS = re.compile(r"\\boxed\s*\{\s*(-?\d{1,12})\s*\}")


@dataclass
class GuessNumberConfig(MultiTurnConfig):
    """The secret is a whole number in ``low..high``; a guess is ``\\boxed{n}``, one per message, and
    ``max_turns`` guesses are allowed (7 always suffice for 1..100 by halving). ``wrong_guess_reward``
    is each wrong guess's reward (e.g. -0.05 to favour fewer guesses); the right one scores 1."""

    low: int = 1
    high: int = 100
    max_turns: int = 8
    wrong_guess_reward: float = 0.0
    prompt_template: str = (
        "I am thinking of a whole number from {low} to {high}. Guess it: write one guess per message as "
        "\\boxed{{n}}, and I will say whether my number is higher or lower. You have {max_turns} guesses."
    )

    def validate(self) -> None:
        super().validate()
        for name in ("low", "high"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or abs(value) >= 10**12:
                raise ValueError(f"{name} must be an integer of at most 12 digits, got {value!r}")
        if self.low >= self.high:
            raise ValueError(f"low must be < high, got {self.low} and {self.high}")
        reward = self.wrong_guess_reward
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"wrong_guess_reward must be a finite number, got {reward!r}")
        validate_prompt_template(self.prompt_template, "low", "high", optional=("max_turns",))


def last_guess(text: str) -> int | None:
    guesses = _GUESS.findall(text)
    return int(guesses[-1]) if guesses else None


@dataclass(frozen=True)
class GuessedNumber:
    """1.0 when the message's last ``\\boxed{n}`` is the secret."""

    in_process_safe = True  # one linear regex

    def __call__(self, completion: str, *, answer: Any, **info: Any) -> VerifyResult:
        guess = last_guess(completion)
        if guess is None:
            return VerifyResult(0.0, NO_ANSWER, {"components": {"correct": 0.0}})
        correct = float(guess == int(answer))
        return VerifyResult(correct, OK, {"guess": guess, "components": {"correct": correct}})


class GuessNumberTask(MultiTurnTask):
    config_cls = GuessNumberConfig

    def problem(self, index: int, seed: int) -> Problem:
        cfg = self.config
        secret = int(np.random.default_rng([seed, index]).integers(cfg.low, cfg.high + 1))
        prompt = cfg.prompt_template.format(low=cfg.low, high=cfg.high, max_turns=cfg.max_turns)
        return Problem(prompt, str(secret), {"index": index})

    @property
    def verifier(self):
        return GuessedNumber()

    def gold_completion(self, problem: Problem) -> str:
        return f"My guess is \\boxed{{{problem.answer}}}."

    def reply(self, problem: Problem, messages: list[dict[str, str]]) -> Reply | None:
        guess = last_guess(messages[-1]["content"])
        if guess is None:
            return Reply("Write your guess as \\boxed{n}.", self.config.wrong_guess_reward)
        if guess == int(problem.answer):
            return None  # the final answer: the verifier scores it
        return Reply("Higher." if guess < int(problem.answer) else "Lower.", self.config.wrong_guess_reward)
