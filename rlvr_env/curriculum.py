"""Curriculum: raise a task's difficulty when the recent success rate passes a threshold; StepSchedule: move task
config fields with the training step (few-shot fading, format-credit decay), a pure function of the step."""

from __future__ import annotations

import math
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


RAMP_KEYS = ("from", "to", "start_step", "end_step")


class StepSchedule:
    """Task config changes as a pure function of the training step: the other way to drive a task's options
    (``Curriculum`` moves on successes, which a resumed run would have to replay; this moves on the step alone).

    ``ramps`` maps a task config field to ``{"from": a, "to": b, "end_step": n}`` (and optionally
    ``"start_step": m``, default 0): the field is ``a`` up to step ``m``, ``b`` from step ``n`` on, and linear in
    between; when ``a`` and ``b`` are both integers the value is rounded to an integer. ``at(step)`` gives the
    changes for a step, to apply as ``reset(options={"task": schedule.at(step)})`` or ``task.configure(**...)``.
    E.g. ``{"few_shot_keep": {"from": 1.0, "to": 0.0, "end_step": 40}}`` fades few-shot examples out over 40
    steps and ``{"format_weight": {"from": 0.1, "to": 0.0, "end_step": 60}}`` withdraws format credit.
    Errors name the field and the ramp key (``name`` prefixes them, e.g. ``env.schedule``)."""

    def __init__(self, ramps: Mapping[str, Mapping[str, Any]], name: str = "schedule") -> None:
        if not isinstance(ramps, Mapping):
            raise ValueError(f"{name} must map task config fields to ramps {{from, to, end_step}}, got {ramps!r}")
        self.name = name
        self.ramps: dict[str, dict[str, Any]] = {}
        for field, ramp in ramps.items():
            where = f"{name}.{field}"
            if not isinstance(ramp, Mapping):
                raise ValueError(f"{where} must be a mapping {{from, to, end_step[, start_step]}}, got {ramp!r}")
            if unknown := sorted(set(ramp) - set(RAMP_KEYS)):
                raise ValueError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(RAMP_KEYS)}")
            if missing := [key for key in ("from", "to", "end_step") if key not in ramp]:
                raise ValueError(f"{where}: missing {', '.join(missing)} (a ramp is {{from, to, end_step[, start_step]}})")
            for key in ("from", "to"):
                value = ramp[key]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise ValueError(f"{where}.{key} must be a finite number, got {value!r}")
            start, end = ramp.get("start_step", 0), ramp["end_step"]
            for key, value in (("start_step", start), ("end_step", end)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"{where}.{key} must be an integer step >= 0, got {value!r}")
            if end <= start:
                raise ValueError(f"{where}.end_step must be > start_step ({start}), got {end}")
            self.ramps[field] = {"from": ramp["from"], "to": ramp["to"], "start_step": start, "end_step": end}

    def __bool__(self) -> bool:
        return bool(self.ramps)

    def at(self, step: int) -> dict[str, Any]:
        """The task config changes in force at training step ``step`` (step 1 is the first update)."""
        changes = {}
        for field, ramp in self.ramps.items():
            progress = min(1.0, max(0.0, (step - ramp["start_step"]) / (ramp["end_step"] - ramp["start_step"])))
            value = ramp["from"] + (ramp["to"] - ramp["from"]) * progress
            integral = isinstance(ramp["from"], int) and isinstance(ramp["to"], int)
            changes[field] = int(round(value)) if integral else float(value)
        return changes

    def endpoints(self) -> list[dict[str, Any]]:
        """The changes at the first and last step of every ramp: what a config check validates up front
        (every value in between lies between them)."""
        return [self.at(ramp[key]) for ramp in self.ramps.values() for key in ("start_step", "end_step")]
