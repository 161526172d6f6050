"""Curriculum: raise a task's difficulty when the recent success rate passes a threshold."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np


class Curriculum:
    """Steps through ``levels`` (task config changes, easiest first) as successes come in.

    ``record`` takes the outcome of finished episodes; once the last ``window``
    outcomes succeed at rate >= ``threshold`` the level goes up and the window
    restarts. Usable on its own with TokenVectorEnv: pass ``{"task": curriculum.current}``
    to ``reset(options=...)``.
    """

    def __init__(self, levels: list[dict[str, Any]], threshold: float = 0.8, window: int = 64) -> None:
        if not levels:
            raise ValueError("levels must list at least one set of task config changes")
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.levels = [dict(level) for level in levels]
        self.threshold = threshold
        self.level = 0
        self._recent: deque[bool] = deque(maxlen=window)

    @property
    def current(self) -> dict[str, Any]:
        return self.levels[self.level]

    @property
    def success_rate(self) -> float | None:
        return sum(self._recent) / len(self._recent) if self._recent else None

    def record(self, successes: bool | Iterable[bool]) -> bool:
        """Add one outcome (a bool, numpy bool or 0-d tensor) or many; True when this raised the level."""
        one = isinstance(successes, (bool, np.bool_)) or getattr(successes, "ndim", None) == 0
        self._recent.extend([bool(successes)] if one else [bool(s) for s in successes])
        full = len(self._recent) == self._recent.maxlen
        if full and self.success_rate >= self.threshold and self.level < len(self.levels) - 1:
            self.level += 1
            self._recent.clear()
            return True
        return False


class CurriculumWrapper(gym.Wrapper):
    """Applies ``curriculum.current`` at every reset and records each finished episode's
    ``info["success"]``; ``info["curriculum_level"]`` reports the level in use.
    By default the levels are the task's own ``curriculum_levels()``."""

    def __init__(self, env: gym.Env, levels: list[dict[str, Any]] | None = None, threshold: float = 0.8, window: int = 64):
        super().__init__(env)
        task = env.unwrapped.task
        levels = task.curriculum_levels() if levels is None else levels
        if not levels:
            raise ValueError(f"{type(task).__name__} defines no curriculum levels; pass levels=[{{...}}, ...]")
        self.curriculum = Curriculum(levels, threshold, window)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        options = dict(options or {})
        changes = options.get("task")
        if changes is None or isinstance(changes, Mapping):  # anything else is left to the env's error naming it
            options["task"] = {**self.curriculum.current, **(changes or {})}
        obs, info = self.env.reset(seed=seed, options=options)
        return obs, {**info, "curriculum_level": self.curriculum.level}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            info = {**info, "curriculum_level": self.curriculum.level}
            self.curriculum.record(bool(info["success"]))
        return obs, reward, terminated, truncated, info
