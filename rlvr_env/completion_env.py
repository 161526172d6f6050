"""CompletionEnv: observation = prompt text, action = the whole completion, one step."""

from __future__ import annotations

import copy
import numbers
import warnings
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from rewards.result import VerifyResult
from rlvr_env.prompting import render_prompt, validate_chat_template_kwargs
from rlvr_env.registry import make_task
from rlvr_env.spaces import UnicodeText
from rlvr_env.task import Problem, Task

# How many indices a procedural task draws from.
PROCEDURAL_INDEX_RANGE = 2**31


def apply_task_option(task: Task, changes: Any) -> None:
    """``reset(options={"task": {...}})``: config changes (e.g. difficulty) from this episode on."""
    if changes is None:
        return
    if not isinstance(changes, Mapping):
        raise ValueError(f"reset option 'task' must be a mapping of {type(task.config).__name__} fields, got {changes!r}")
    if changes:
        task.configure(**changes)


def checked_problem_index(task: Task, index: Any, option: str) -> int:
    """``index`` as an int, or a ValueError naming the reset ``option``: a procedural task takes
    any index >= 0, a dataset one below its size."""
    integral = isinstance(index, numbers.Integral) and not isinstance(index, bool)
    if not integral or index < 0 or (task.size is not None and index >= task.size):
        bound = f"[0, {task.size})" if task.size is not None else "an integer >= 0"
        raise ValueError(f"reset option {option!r}: {index!r} is not a problem index of {type(task).__name__} ({bound})")
    return int(index)


def problem_from_options(task: Task, np_random, problem_seed: int, options: dict[str, Any] | None) -> tuple[int, Problem]:
    """The episode's problem: ``options["problem_index"]`` or a draw from ``np_random``,
    after applying ``options["task"]`` (config changes such as difficulty)."""
    options = dict(options or {})
    task_changes = options.pop("task", None)
    index = options.pop("problem_index", None)
    if options:
        raise ValueError(f"unknown reset option {sorted(options)[0]!r}; known: problem_index, task")
    apply_task_option(task, task_changes)
    if index is None:
        index = int(np_random.integers(0, task.size or PROCEDURAL_INDEX_RANGE))
    index = checked_problem_index(task, index, "problem_index")
    return index, task.problem(index, problem_seed)


def outcome_info(task: Task, problem: Problem, result: VerifyResult) -> dict[str, Any]:
    """The final step's info: gold answer, each verifier component, status, success."""
    return {
        "answer": problem.answer,
        "reward_components": dict(result.details.get("components", {})),
        "verifier_status": result.status,
        "success": task.is_success(result),
    }


# Characters of a completion the verifier reads: 256k, about 64k tokens of English, the longest reasoning budgets
# (R1-style traces run to tens of thousands of tokens). A longer completion is scored on its prefix, loudly.
MAX_COMPLETION_CHARS = 262_144


class CompletionEnv(gym.Env):
    """One episode = one problem. ``reset`` returns the prompt (rendered through the
    tokenizer's chat template when a tokenizer with one is given); ``step(completion)``
    scores it and ends the episode (``terminated=True``). A completion longer than
    ``max_completion_chars`` (MAX_COMPLETION_CHARS) is scored on its first ``max_completion_chars``
    characters: ``truncated=True``, ``info["verifier_status"] = "truncated"`` (the prefix's own status in
    ``info["prefix_status"]``) and a warning the first time.

    ``reset(options=...)``: ``{"problem_index": i}`` picks a problem, ``{"task": {...}}``
    changes task config fields (difficulty) from this episode on.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        task: Task,
        tokenizer=None,
        use_chat_template: bool = True,
        max_prompt_chars: int = 16_384,
        max_completion_chars: int = MAX_COMPLETION_CHARS,
        problem_seed: int = 0,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if max_prompt_chars < 1 or max_completion_chars < 1:
            raise ValueError("max_prompt_chars and max_completion_chars must be positive")
        validate_chat_template_kwargs(chat_template_kwargs)
        self.task = copy.copy(task)  # reset options reconfigure this env's copy, never the caller's task
        self.tokenizer = tokenizer
        self.use_chat_template = use_chat_template
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.max_completion_chars = max_completion_chars
        self.problem_seed = problem_seed
        self.observation_space = UnicodeText(max_prompt_chars, min_length=1)
        self.action_space = UnicodeText(max_completion_chars)
        self.problem: Problem | None = None
        self._warned_truncation = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        index, self.problem = problem_from_options(self.task, self.np_random, self.problem_seed, options)
        messages = self.task.messages(self.problem)
        prompt = render_prompt(messages, self.tokenizer, self.use_chat_template, self.chat_template_kwargs)
        if len(prompt) > self.observation_space.max_length:
            limit = self.observation_space.max_length
            raise ValueError(f"prompt of problem {index} has {len(prompt)} characters > max_prompt_chars={limit}")
        self._prompt = prompt
        return prompt, {"problem_index": int(index), "messages": messages}

    def step(self, action: str):
        if self.problem is None:
            raise RuntimeError("call reset() before step()")
        if not isinstance(action, str):
            raise TypeError(f"action must be the completion text (str), got {type(action).__name__}")
        truncated = len(action) > self.max_completion_chars
        result = self.task.verify(action[: self.max_completion_chars], self.problem)
        info = outcome_info(self.task, self.problem, result)
        if truncated:
            info.update(verifier_status="truncated", prefix_status=result.status)
            if not self._warned_truncation:
                self._warned_truncation = True
                warnings.warn(f"a completion of {len(action)} characters was scored on its first max_completion_chars = "
                              f"{self.max_completion_chars} (info['verifier_status'] = 'truncated'); raise "
                              "max_completion_chars to score all of it", stacklevel=2)
        self.problem = None  # one step per episode
        return self._prompt, float(result.score), True, truncated, info


# CompletionEnv's own keyword arguments; everything else given to gymnasium.make is a task config field.
ENV_ARGUMENTS = ("tokenizer", "use_chat_template", "chat_template_kwargs", "max_prompt_chars", "max_completion_chars",
                 "problem_seed")


def make_completion_env(task_id: str, **kwargs: Any) -> CompletionEnv:
    """Gymnasium entry point of every registered task id."""
    env_kwargs = {key: kwargs.pop(key) for key in ENV_ARGUMENTS if key in kwargs}
    return CompletionEnv(make_task(task_id, **kwargs), **env_kwargs)
