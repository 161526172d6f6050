"""TokenEnv: one token per step, the reward on the final token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rlvr_env.completion_env import outcome_info, problem_from_options
from rlvr_env.prompting import encode_prompts, render_prompt, uses_chat_template
from rlvr_env.task import Task


def stop_ids_of(tokenizer, stop_token_ids: Sequence[int] | None) -> list[int]:
    """The ids that end a completion: ``stop_token_ids`` or the tokenizer's EOS."""
    ids = list(stop_token_ids) if stop_token_ids is not None else [tokenizer.eos_token_id]
    if not ids or any(i is None or not 0 <= i < len(tokenizer) for i in ids):
        raise ValueError(f"stop_token_ids must be token ids of the tokenizer (vocab {len(tokenizer)}), got {ids}")
    return ids


class TokenEnv(gym.Env):
    """Observation: token ids of prompt + generated tokens (a 1-D int64 array);
    action: one token id. A stop token (EOS by default) ends the episode with
    ``terminated=True``; reaching ``max_new_tokens`` with ``truncated=True``. The
    task's score is the reward of that final step (0 before); the final ``info``
    holds ``completion``, ``answer``, ``reward_components``, ``verifier_status``, ``success``.

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
    ) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.task = task
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.use_chat_template = use_chat_template
        self.stop_ids = frozenset(stop_ids_of(tokenizer, stop_token_ids))
        self.problem_seed = problem_seed
        self.action_space = spaces.Discrete(len(tokenizer))
        self.observation_space = spaces.Sequence(spaces.Discrete(len(tokenizer)), stack=True)
        self.problem = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        index, self.problem = problem_from_options(self.task, self.np_random, self.problem_seed, options)
        chat = uses_chat_template(self.tokenizer, self.use_chat_template)
        prompt = render_prompt(self.task.messages(self.problem), self.tokenizer, self.use_chat_template)
        self._prompt_ids = encode_prompts([prompt], self.tokenizer, chat_rendered=chat)[0]
        self._generated: list[int] = []
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
        if not (terminated or truncated):
            return self._observation(), 0.0, False, False, {}
        response = self._generated[:-1] if terminated else self._generated
        completion = self.tokenizer.decode(response, skip_special_tokens=True)
        result = self.task.verify(completion, self.problem)
        info = {"completion": completion, **outcome_info(self.task, self.problem, result)}
        self.problem = None
        return self._observation(), float(result.score), terminated, truncated, info
