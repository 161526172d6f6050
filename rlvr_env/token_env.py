"""TokenEnv: one token per step, the reward on the final token (plus optional process rewards)."""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rlvr_env.completion_env import outcome_info, problem_from_options
from rlvr_env.prompting import encode_prompts, render_prompt, uses_chat_template, validate_chat_template_kwargs
from rlvr_env.task import Problem, Task


def stop_ids_of(tokenizer, stop_token_ids: Sequence[int] | None) -> list[int]:
    """The ids that end a completion: ``stop_token_ids`` or the tokenizer's EOS."""
    ids = list(stop_token_ids) if stop_token_ids is not None else [tokenizer.eos_token_id]
    if not ids or any(i is None or not 0 <= i < len(tokenizer) for i in ids):
        raise ValueError(f"stop_token_ids must be token ids of the tokenizer (vocab {len(tokenizer)}), got {ids}")
    return ids


@functools.lru_cache(maxsize=8)
def step_end_flags(tokenizer, delimiter: str) -> tuple[bool, ...]:
    """For each token id, whether its own text contains ``delimiter``: generating it ends a reasoning step."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=True)
    flags = tuple(delimiter in text for text in texts)
    if not any(flags):
        warnings.warn(
            f"no single token of the tokenizer contains the process-step delimiter {delimiter!r}: a step it ends "
            "(written over several tokens) is not rewarded until the episode's final step",
            stacklevel=2,
        )
    return flags


def credit_newest_step(task: Task, problem: Problem, text: str, credited: int, final: bool) -> tuple[float, int]:
    """The process reward of the newest step of ``text`` not yet rewarded, and the new ``credited`` offset.

    The newest step ends at the last ``task.process_step_end`` (or, when ``final``, at the end of
    the text); it is rewarded only if it has content past the first ``credited`` characters, so a
    blank line or a repeated delimiter never earns the same step twice."""
    delimiter = task.process_step_end
    if final:
        end = len(text)
    else:
        cut = text.rfind(delimiter)
        end = cut + len(delimiter) if cut >= 0 else 0
    if not text[credited:end].replace(delimiter, "").strip():
        return 0.0, credited
    return float(task.process_reward(problem, text[:end])), end


class TokenEnv(gym.Env):
    """Observation: token ids of prompt + generated tokens (a 1-D int64 array);
    action: one token id. A stop token (EOS by default) ends the episode with
    ``terminated=True``; reaching ``max_new_tokens`` with ``truncated=True``. The
    task's score is the reward of that final step (0 before); the final ``info``
    holds ``completion``, ``answer``, ``reward_components``, ``verifier_status``, ``success``.

    Process rewards, when the task gives them (``task.process_step_end`` is not None): the step
    whose token ends a reasoning step (its text contains the delimiter), and the final step for a
    trailing step without one, also get ``task.process_reward(problem, text_so_far)``.

    ``reset(options=...)``: ``{"problem_index": i}`` and ``{"task": {...}}`` as in CompletionEnv.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        task: Task,
        tokenizer,
        max_new_tokens: int,
        use_chat_template: bool = True,
        stop_token_ids: Sequence[int] | None = None,
        problem_seed: int = 0,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        validate_chat_template_kwargs(chat_template_kwargs)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.task = copy.copy(task)  # reset options reconfigure this env's copy, never the caller's task
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.use_chat_template = use_chat_template
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.stop_ids = frozenset(stop_ids_of(tokenizer, stop_token_ids))
        self.problem_seed = problem_seed
        self.action_space = spaces.Discrete(len(tokenizer))
        self.observation_space = spaces.Sequence(spaces.Discrete(len(tokenizer)), stack=True)
        self.problem = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        index, self.problem = problem_from_options(self.task, self.np_random, self.problem_seed, options)
        chat = uses_chat_template(self.tokenizer, self.use_chat_template)
        prompt = render_prompt(self.task.messages(self.problem), self.tokenizer, self.use_chat_template,
                               self.chat_template_kwargs)
        self._prompt_ids = encode_prompts([prompt], self.tokenizer, chat_rendered=chat)[0]
        self._generated: list[int] = []
        delimiter = self.task.process_step_end
        self._step_ends = step_end_flags(self.tokenizer, delimiter) if delimiter is not None else None
        self._credited_chars = 0
        return self._observation(), {"problem_index": index}

    def _observation(self) -> np.ndarray:
        return np.array(self._prompt_ids + self._generated, dtype=np.int64)

    def step(self, action):
        if self.problem is None:
            raise RuntimeError("call reset() before step(), and again after the episode ends")
        token = int(action)
        if not 0 <= token < self.action_space.n:
            raise ValueError(f"action {token} is not a token id in [0, {self.action_space.n})")
        self._generated.append(token)
        terminated = token in self.stop_ids
        truncated = not terminated and len(self._generated) >= self.max_new_tokens
        ended = terminated or truncated
        ends_step = self._step_ends is not None and self._step_ends[token]
        if not (ended or ends_step):
            return self._observation(), 0.0, False, False, {}
        response = self._generated[:-1] if terminated else self._generated
        completion = self.tokenizer.decode(response, skip_special_tokens=True)
        reward = 0.0
        if self._step_ends is not None:
            reward, self._credited_chars = credit_newest_step(
                self.task, self.problem, completion, self._credited_chars, final=ended
            )
        if not ended:
            return self._observation(), reward, False, False, {}
        result = self.task.verify(completion, self.problem)
        info = {"completion": completion, **outcome_info(self.task, self.problem, result)}
        self.problem = None
        return self._observation(), reward + float(result.score), terminated, truncated, info
