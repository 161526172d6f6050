"""TokenVectorEnv: B token-level episodes stepped at once, state as torch tensors on a device.

Autoreset is DISABLED: one batch is one rollout. The agent resets, steps until
``all_done``, reads ``results()``, and resets again. Rows finish independently
(a stop token -> terminated, ``max_new_tokens`` -> truncated); the rows that
finish on a step are decoded and scored together through ``rewards.score_batch``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

import rewards
from rlvr_env.completion_env import PROCEDURAL_INDEX_RANGE
from rlvr_env.prompting import encode_prompts, render_prompt, uses_chat_template
from rlvr_env.task import Problem, Task
from rlvr_env.token_env import stop_ids_of


@dataclass
class RolloutResult:
    """A finished batch. T = steps taken (the longest response), B = num_envs."""

    response_ids: torch.Tensor  # Long[B, T], pad after a row's end
    response_mask: torch.Tensor  # Long[B, T], 1 on generated tokens incl. the stop token
    scores: torch.Tensor  # Float[B]
    reward_components: dict[str, torch.Tensor]  # name -> Float[B]
    statuses: list[str]
    completions: list[str]
    truncated: torch.Tensor  # Bool[B]
    group_ids: torch.Tensor  # Long[B], rows sharing a prompt share an id
    problems: list[Problem]


class TokenVectorEnv(VectorEnv):
    metadata = {"autoreset_mode": AutoresetMode.DISABLED}

    def __init__(
        self,
        task: Task,
        tokenizer,
        num_envs: int,
        max_new_tokens: int,
        device: str | torch.device = "cpu",
        max_prompt_tokens: int | None = None,
        use_chat_template: bool = True,
        system_prompt: str | None = None,
        stop_token_ids: Sequence[int] | None = None,
        problem_seed: int = 0,
        score_workers: int | None = None,
    ) -> None:
        """``system_prompt`` overrides the task's; ``max_prompt_tokens`` makes a longer prompt
        an error (None: no limit); ``score_workers`` goes to ``rewards.score_batch``."""
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if max_prompt_tokens is not None and max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1 or None, got {max_prompt_tokens}")
        if tokenizer.pad_token_id is None and tokenizer.eos_token_id is None:
            raise ValueError("tokenizer needs a pad_token_id or an eos_token_id to pad with")
        if system_prompt is not None:
            task.configure(system_prompt=system_prompt)
        self.task = task
        self.tokenizer = tokenizer
        self.num_envs = num_envs
        self.max_new_tokens = max_new_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.device = torch.device(device)
        self.use_chat_template = use_chat_template
        self.problem_seed = problem_seed
        self.score_workers = score_workers
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.stop_ids = torch.tensor(stop_ids_of(tokenizer, stop_token_ids), device=self.device)
        vocab = len(tokenizer)
        self.single_action_space = spaces.Discrete(vocab)
        self.action_space = spaces.MultiDiscrete(np.full(num_envs, vocab))
        self._set_observation_space(max_prompt_tokens or 1)
        self._steps = 0
        self._statuses: list[str | None] = [None] * num_envs
        self._num_finished = num_envs  # nothing to step before the first reset

    def _set_observation_space(self, prompt_width: int) -> None:
        """The Box width follows each batch's prompt width P (set at reset): P + max_new_tokens."""
        width, vocab = prompt_width + self.max_new_tokens, len(self.tokenizer)
        self.single_observation_space = spaces.Dict(
            {
                "input_ids": spaces.Box(0, vocab - 1, (width,), np.int64),
                "attention_mask": spaces.Box(0, 1, (width,), np.int64),
                "num_generated": spaces.Box(0, self.max_new_tokens, (), np.int64),
            }
        )
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)

    @property
    def all_done(self) -> bool:
        return self._num_finished == self.num_envs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Options: ``group_size`` G (B % G == 0; rows [k*G:(k+1)*G] share prompt k),
        ``problem_indices`` (B // G ints), ``task`` (config changes, e.g. difficulty)."""
        super().reset(seed=seed)
        options = dict(options or {})
        group_size = options.pop("group_size", 1)
        indices = options.pop("problem_indices", None)
        task_changes = options.pop("task", None)
        if options:
            raise ValueError(f"unknown reset option {sorted(options)[0]!r}; known: group_size, problem_indices, task")
        if not isinstance(group_size, int) or group_size < 1 or self.num_envs % group_size:
            raise ValueError(f"group_size must be a positive divisor of num_envs={self.num_envs}, got {group_size!r}")
        num_prompts = self.num_envs // group_size
        if task_changes:
            self.task.configure(**task_changes)
        if indices is None:
            indices = self.np_random.integers(0, self.task.size or PROCEDURAL_INDEX_RANGE, size=num_prompts).tolist()
        elif len(indices) != num_prompts:
            raise ValueError(f"problem_indices needs num_envs // group_size = {num_prompts} entries, got {len(indices)}")
        unique_problems = [self.task.problem(int(i), self.problem_seed) for i in indices]
        self.problems = [p for p in unique_problems for _ in range(group_size)]

        chat = uses_chat_template(self.tokenizer, self.use_chat_template)
        texts = [render_prompt(self.task.messages(p), self.tokenizer, self.use_chat_template) for p in unique_problems]
        encoded = encode_prompts(texts, self.tokenizer, chat_rendered=chat)
        width = max(len(ids) for ids in encoded)
        if self.max_prompt_tokens is not None and width > self.max_prompt_tokens:
            longest = max(range(num_prompts), key=lambda k: len(encoded[k]))
            raise ValueError(f"prompt of problem {indices[longest]} has {width} tokens > max_prompt_tokens={self.max_prompt_tokens}")
        prompt_ids = torch.full((num_prompts, width), self.pad_id, dtype=torch.long)
        for k, ids in enumerate(encoded):
            prompt_ids[k, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        prompt_ids = prompt_ids.repeat_interleave(group_size, dim=0).to(self.device)

        batch, total = self.num_envs, width + self.max_new_tokens
        self.prompt_width = width
        self.input_ids = torch.full((batch, total), self.pad_id, dtype=torch.long, device=self.device)
        self.input_ids[:, :width] = prompt_ids
        self.attention_mask = torch.zeros((batch, total), dtype=torch.long, device=self.device)
        # Left padding: positions before the first real token are pad even if pad == a real id.
        lengths = torch.tensor([len(ids) for ids in encoded]).repeat_interleave(group_size).to(self.device)
        self.attention_mask[:, :width] = (torch.arange(width, device=self.device) >= width - lengths[:, None]).long()
        self.num_generated = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.terminated = torch.zeros(batch, dtype=torch.bool, device=self.device)
        self.truncated = torch.zeros(batch, dtype=torch.bool, device=self.device)
        self.scores = torch.zeros(batch, dtype=torch.float32, device=self.device)
        self.group_ids = torch.arange(num_prompts, device=self.device).repeat_interleave(group_size)
        self._components: dict[str, list[float]] = {}
        self._statuses: list[str | None] = [None] * batch
        self._completions: list[str | None] = [None] * batch
        self._steps = 0
        self._num_finished = 0
        self._set_observation_space(width)
        return self._observation(), {"group_ids": self.group_ids, "problem_indices": [int(i) for i in indices]}

    @property
    def prompt_ids(self) -> torch.Tensor:
        return self.input_ids[:, : self.prompt_width]

    @property
    def prompt_mask(self) -> torch.Tensor:
        return self.attention_mask[:, : self.prompt_width]

    def _observation(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "num_generated": self.num_generated}

    def step(self, actions):
        """actions: Long[B] token ids -> (obs, reward Float[B], terminated Bool[B], truncated Bool[B], info)."""
        if self.all_done:
            raise RuntimeError("every row has finished: read results() and call reset()")
        actions = torch.as_tensor(actions, device=self.device).long().reshape(self.num_envs)
        active = ~(self.terminated | self.truncated)
        column = self.prompt_width + self._steps
        self.input_ids[:, column] = torch.where(active, actions, self.pad_id)
        self.attention_mask[:, column] = active.long()
        self.num_generated += active.long()
        self._steps += 1
        ended = active & torch.isin(actions, self.stop_ids)
        self.terminated |= ended
        if self._steps == self.max_new_tokens:
            ended = active
            self.truncated |= active & ~self.terminated
        reward = torch.zeros(self.num_envs, dtype=torch.float32, device=self.device)
        rows = ended.nonzero().flatten()
        if rows.numel():  # the one host sync per step: which rows to score
            self._score(rows.tolist())
            reward[rows] = self.scores[rows]
        return self._observation(), reward, self.terminated.clone(), self.truncated.clone(), {"ended": ended}

    def _score(self, rows: list[int]) -> None:
        start = self.prompt_width
        responses = self.input_ids[rows, start : start + self._steps].tolist()
        lengths = self.num_generated[rows].tolist()
        terminated = self.terminated[rows].tolist()
        # The text the verifier sees excludes the stop token.
        texts = self.tokenizer.batch_decode(
            [ids[: n - stopped] for ids, n, stopped in zip(responses, lengths, terminated)], skip_special_tokens=True
        )
        results = rewards.score_batch(
            texts, [self.problems[r].answer for r in rows], verifier=self.task.verifier, workers=self.score_workers
        )
        self.scores[rows] = torch.tensor([r.score for r in results], dtype=torch.float32, device=self.device)
        for row, text, result in zip(rows, texts, results):
            self._completions[row], self._statuses[row] = text, result.status
            for name, value in result.details.get("components", {}).items():
                self._components.setdefault(name, [0.0] * self.num_envs)[row] = float(value)
        self._num_finished += len(rows)

    def results(self) -> RolloutResult:
        if not self.all_done or None in self._statuses:
            raise RuntimeError("results() needs a finished batch: step until all_done")
        end = self.prompt_width + self._steps
        return RolloutResult(
            response_ids=self.input_ids[:, self.prompt_width : end],
            response_mask=self.attention_mask[:, self.prompt_width : end],
            scores=self.scores,
            reward_components={
                name: torch.tensor(values, dtype=torch.float32, device=self.device) for name, values in self._components.items()
            },
            statuses=list(self._statuses),
            completions=list(self._completions),
            truncated=self.truncated.clone(),
            group_ids=self.group_ids,
            problems=list(self.problems),
        )
