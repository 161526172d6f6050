"""TokenVectorEnv: B token-level episodes stepped at once, state as torch tensors on a device.

Autoreset is DISABLED: one batch is one rollout. The agent resets, steps until
``all_done``, reads ``results()``, and resets again. Rows finish independently
(a stop token -> terminated, ``max_new_tokens`` -> truncated); the rows that
finish on a step are decoded and scored together through ``rewards.score_batch``
with the task's verifier, the hook every view scores through.

Stepping is a handful of in-place tensor ops on preallocated buffers and one
host sync (whether any row ended); rows are decoded and scored only when they
finish, and the task's process rewards (if any) only at steps that end a
reasoning step. A generator that produces whole completions at once (vllm, a
script) hands them to ``finish_with``, which leaves the env as stepping them
token by token would, with every row decoded and scored in one batch.
"""

from __future__ import annotations

import copy
import numbers
import sys
import types
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper
from gymnasium.vector.utils import batch_space

import rewards
from rlvr_env.completion_env import PROCEDURAL_INDEX_RANGE, apply_task_option, checked_problem_index
from rlvr_env.prompting import encode_prompts, render_prompt, uses_chat_template, validate_chat_template_kwargs
from rlvr_env.task import Problem, Task, solved
from rlvr_env.token_env import credit_newest_step, step_end_flags, stop_ids_of


def draw_problem_indices(np_random: np.random.Generator, task_size: int | None, count: int) -> list[int]:
    """``count`` problem indices as a reset draws them: below a dataset's size, or in the procedural range."""
    return np_random.integers(0, task_size or PROCEDURAL_INDEX_RANGE, size=count).tolist()


@dataclass
class RolloutResult:
    """A finished batch. T = steps taken (the longest response), B = num_envs, P = the batch's prompt width."""

    prompt_ids: torch.Tensor  # Long[B, P], left padded: the prompt each row was generated from
    prompt_mask: torch.Tensor  # Long[B, P], 1 on the prompt's own tokens
    response_ids: torch.Tensor  # Long[B, T], pad after a row's end
    response_mask: torch.Tensor  # Long[B, T], 1 on generated tokens incl. the stop token
    scores: torch.Tensor  # Float[B]
    reward_components: dict[str, torch.Tensor]  # name -> Float[B]
    statuses: list[str]
    completions: list[str]
    truncated: torch.Tensor  # Bool[B]
    group_ids: torch.Tensor  # Long[B], rows sharing a prompt share an id
    problems: list[Problem]
    process_rewards: torch.Tensor  # Float[B, T], the task's per-step rewards (all 0 when it gives none)
    process_step_mask: torch.Tensor  # Bool[B, T], True on each token that ended a reasoning step, rewarded or not

    @property
    def solved(self) -> torch.Tensor:
        """Bool[B]: rows that solved their problem, by the rule Task.is_success applies (rlvr_env.task.solved)."""
        return solved(self.scores, self.reward_components)


def _refuse_gymnasium_vector_wrapper(caller: types.FrameType) -> None:
    """Refuse a reset called (``caller``: the calling frame) by one of Gymnasium's own vector wrappers, which
    otherwise fail with a TypeError deep inside. They compute on numpy arrays and count an episode whenever a row ends,
    expecting it to reset; here finished rows stay terminated until the whole batch is done, so even numpy arrays
    would not make RecordEpisodeStatistics count right. A wrapper of the user's own is left alone."""
    wrapper = caller.f_locals.get("self")
    if isinstance(wrapper, VectorWrapper) and type(wrapper).__module__.startswith("gymnasium."):
        raise TypeError(
            f"TokenVectorEnv cannot run under Gymnasium's vector wrappers ({type(wrapper).__name__}): they compute on numpy "
            "arrays and reset rows one at a time, while it keeps torch tensors and runs one batch from reset() until "
            "all_done. Read each row's score and length from results(), or use the wrappers on a vector of completion or "
            "token envs (gymnasium.make_vec('rlvr/...'), SyncVectorEnv of TokenEnv); see docs/environments.md"
        )


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
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        """``system_prompt`` overrides the task's; ``max_prompt_tokens`` makes a longer prompt
        an error (None: no limit); ``score_workers`` goes to ``rewards.score_batch``;
        ``chat_template_kwargs`` are the chat template's own variables (Qwen3's enable_thinking)."""
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if max_prompt_tokens is not None and max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1 or None, got {max_prompt_tokens}")
        if tokenizer.pad_token_id is None and tokenizer.eos_token_id is None:
            raise ValueError("tokenizer needs a pad_token_id or an eos_token_id to pad with")
        validate_chat_template_kwargs(chat_template_kwargs)
        self.task = copy.copy(task)  # system_prompt and reset options reconfigure this copy, never the caller's task
        if system_prompt is not None:
            self.task.configure(system_prompt=system_prompt)
        self.tokenizer = tokenizer
        self.num_envs = num_envs
        self.max_new_tokens = max_new_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.device = torch.device(device)
        self.use_chat_template = use_chat_template
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.problem_seed = problem_seed
        self.score_workers = score_workers
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._stop_id_set = frozenset(stop_ids_of(tokenizer, stop_token_ids))
        self.stop_ids = torch.tensor(sorted(self._stop_id_set), device=self.device)
        vocab = len(tokenizer)
        self._pad = torch.tensor(self.pad_id, device=self.device)
        self._is_stop = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        self._is_stop[self.stop_ids] = True
        self._step_end_delimiter: str | None = None
        self._is_step_end: torch.Tensor | None = None
        self.single_action_space = spaces.Discrete(vocab)
        self.action_space = spaces.MultiDiscrete(np.full(num_envs, vocab))
        self._set_observation_space(max_prompt_tokens or 1)
        self._steps = 0
        self._statuses: list[str | None] = [None] * num_envs
        self._num_finished = num_envs  # nothing to step before the first reset
        self._warned_verifier_error = False

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
        _refuse_gymnasium_vector_wrapper(sys._getframe(1))
        super().reset(seed=seed)
        options = dict(options or {})
        group_size = options.pop("group_size", 1)
        indices = options.pop("problem_indices", None)
        task_changes = options.pop("task", None)
        if options:
            raise ValueError(f"unknown reset option {sorted(options)[0]!r}; known: group_size, problem_indices, task")
        whole_number = isinstance(group_size, numbers.Integral) and not isinstance(group_size, bool)
        if not whole_number or group_size < 1 or self.num_envs % group_size:
            raise ValueError(f"group_size must be a positive divisor of num_envs={self.num_envs}, got {group_size!r}")
        group_size = int(group_size)
        num_prompts = self.num_envs // group_size
        apply_task_option(self.task, task_changes)
        self._verifier = self.task.verifier  # once per batch: tasks build it from their config
        if indices is None:
            indices = draw_problem_indices(self.np_random, self.task.size, num_prompts)
        elif len(indices) != num_prompts:
            raise ValueError(f"problem_indices needs num_envs // group_size = {num_prompts} entries, got {len(indices)}")
        indices = [checked_problem_index(self.task, i, "problem_indices") for i in indices]
        unique_problems = [self.task.problem(i, self.problem_seed) for i in indices]
        self.problems = [p for p in unique_problems for _ in range(group_size)]

        chat = uses_chat_template(self.tokenizer, self.use_chat_template)
        texts = [render_prompt(self.task.messages(p), self.tokenizer, self.use_chat_template, self.chat_template_kwargs)
                 for p in unique_problems]
        encoded = encode_prompts(texts, self.tokenizer, chat_rendered=chat)
        width = max(len(ids) for ids in encoded)
        if self.max_prompt_tokens is not None and width > self.max_prompt_tokens:
            longest = max(range(num_prompts), key=lambda k: len(encoded[k]))
            raise ValueError(
                f"prompt of problem {indices[longest]} has {width} tokens > max_prompt_tokens={self.max_prompt_tokens}"
            )
        prompt_ids = torch.full((num_prompts, width), self.pad_id, dtype=torch.long)
        for k, ids in enumerate(encoded):
            prompt_ids[k, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        prompt_ids = prompt_ids.repeat_interleave(group_size, dim=0).to(self.device)

        batch, steps, device = self.num_envs, self.max_new_tokens, self.device
        self.prompt_width = width
        self.input_ids = torch.full((batch, width + steps), self.pad_id, dtype=torch.long, device=device)
        self.input_ids[:, :width] = prompt_ids
        self.attention_mask = torch.zeros((batch, width + steps), dtype=torch.long, device=device)
        # Left padding: positions before the first real token are pad even if pad == a real id.
        lengths = torch.tensor([len(ids) for ids in encoded]).repeat_interleave(group_size).to(device)
        self.attention_mask[:, :width] = (torch.arange(width, device=device) >= width - lengths[:, None]).long()
        self.num_generated = torch.zeros(batch, dtype=torch.long, device=device)
        # Column views written in place by step(): no indexing or allocation per step.
        self._id_columns = self.input_ids[:, width:].unbind(1)
        self._mask_columns = self.attention_mask[:, width:].unbind(1)
        self._alive = torch.ones(batch, dtype=torch.bool, device=device)
        # One row per step; step t returns row t, so a returned tensor never changes after step() returns.
        # _terminated_steps has a leading all-False row: the state before the first step.
        self._terminated_steps = torch.zeros((steps + 1, batch), dtype=torch.bool, device=device)
        self._truncated_steps = torch.zeros((steps, batch), dtype=torch.bool, device=device)
        self._ended_steps = torch.zeros((steps, batch), dtype=torch.bool, device=device)
        self._reward_steps = torch.zeros((steps, batch), dtype=torch.float32, device=device)
        self._process_rewards = torch.zeros((batch, steps), dtype=torch.float32, device=device)
        self._process_step_mask = torch.zeros((batch, steps), dtype=torch.bool, device=device)
        buffers = (self._terminated_steps, self._truncated_steps, self._ended_steps, self._reward_steps)
        self._step_rows = [buffer.unbind(0) for buffer in buffers]
        self._step_boundary = torch.zeros(batch, dtype=torch.bool, device=device)
        self._credited_chars = [0] * batch
        self.scores = torch.zeros(batch, dtype=torch.float32, device=device)
        self.group_size = group_size
        self.group_ids = torch.arange(num_prompts, device=device).repeat_interleave(group_size)
        self._components: dict[str, list[float]] = {}
        self._statuses: list[str | None] = [None] * batch
        self._completions: list[str | None] = [None] * batch
        self._steps = 0
        self._num_finished = 0
        self._set_observation_space(width)
        self._update_step_ends()
        self._obs = {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "num_generated": self.num_generated}
        return self._obs, {"group_ids": self.group_ids, "problem_indices": indices}

    @property
    def prompt_ids(self) -> torch.Tensor:
        return self.input_ids[:, : self.prompt_width]

    @property
    def prompt_mask(self) -> torch.Tensor:
        return self.attention_mask[:, : self.prompt_width]

    @property
    def running(self) -> torch.Tensor:
        """Bool[B]: rows still generating (the next step appends their action)."""
        return self._alive

    @property
    def terminated(self) -> torch.Tensor:
        """Bool[B]: rows that ended on a stop token so far."""
        return self._terminated_steps[self._steps]

    @property
    def truncated(self) -> torch.Tensor:
        """Bool[B]: rows cut at max_new_tokens (set on the last step only)."""
        return self._truncated_steps[self._steps - 1] if self._steps else self._truncated_steps[0]

    def _update_step_ends(self) -> None:
        """The Bool[vocab] table of tokens that end a reasoning step, for the task's current delimiter."""
        delimiter = self.task.process_step_end
        if delimiter is None:
            self._is_step_end = None
        elif delimiter != self._step_end_delimiter or self._is_step_end is None:
            flags = step_end_flags(self.tokenizer, delimiter)
            self._is_step_end = torch.tensor(flags, dtype=torch.bool, device=self.device)
        self._step_end_delimiter = delimiter

    def step(self, actions):
        """actions: Long[B] token ids -> (obs, reward Float[B], terminated Bool[B], truncated Bool[B], info).

        The returned tensors are views of per-step buffers: they keep their values until the next reset."""
        if self.all_done:
            raise RuntimeError("every row has finished: read results() and call reset()")
        actions = torch.as_tensor(actions, dtype=torch.long, device=self.device)
        if actions.shape != self._alive.shape:
            actions = actions.reshape(self.num_envs)
        self._check_token_ids(actions, "actions")
        step, alive = self._steps, self._alive
        terminated_rows, truncated_rows, ended_rows, reward_rows = self._step_rows
        tokens, mask = self._id_columns[step], self._mask_columns[step]
        torch.where(alive, actions, self._pad, out=tokens)
        mask.copy_(alive)
        self.num_generated.add_(mask)
        ended, terminated = ended_rows[step], terminated_rows[step + 1]
        torch.index_select(self._is_stop, 0, tokens, out=ended).logical_and_(alive)
        torch.logical_or(terminated_rows[step], ended, out=terminated)
        if step + 1 == self.max_new_tokens:  # every row still going ends now; those without a stop token are truncated
            torch.logical_xor(alive, ended, out=truncated_rows[step])
            ended.copy_(alive)
        boundary = None
        if self._is_step_end is not None:
            boundary = torch.index_select(self._is_step_end, 0, tokens, out=self._step_boundary).logical_and_(alive)
            boundary.logical_and_(~ended)
        alive.logical_xor_(ended)
        self._steps += 1
        # The host syncs of a step (one without process rewards): which rows need text work?
        if ended.any():
            rows = ended.nonzero().flatten()
            self._finish(rows, torch.full_like(rows, step))
        if boundary is not None and boundary.any():
            rows = boundary.nonzero().flatten()
            self._credit_step_ends(rows, torch.full_like(rows, step))
        return self._obs, reward_rows[step], terminated, truncated_rows[step], {"ended": ended}

    def finish_with(self, response_ids) -> RolloutResult:
        """Long[B, T] the rest of every row's tokens -> results(), the env left as step() given them column by column would.

        A row ends at its first stop token or is truncated at max_new_tokens; ids after its end are ignored (pad them),
        and T must reach every row's end. The rows are decoded and scored in one batch."""
        if self.all_done:
            raise RuntimeError("every row has finished: read results() and call reset()")
        response_ids = torch.as_tensor(response_ids, dtype=torch.long, device=self.device)
        if response_ids.ndim != 2 or response_ids.shape[0] != self.num_envs:
            raise ValueError(f"response_ids must be Long[num_envs={self.num_envs}, T], got shape {tuple(response_ids.shape)}")
        start, alive = self._steps, self._alive
        budget = self.max_new_tokens - start
        ids = response_ids[:, :budget]
        self._check_token_ids(ids, "response_ids")
        is_stop = self._is_stop[ids]
        has_stop = is_stop.any(1)
        unended = alive & ~has_stop
        if ids.shape[1] < budget and unended.any():
            rows = unended.nonzero().flatten().tolist()
            raise ValueError(
                f"rows {rows[:8]} have no stop token in their {ids.shape[1]} response_ids and would go on "
                f"past them (max_new_tokens={self.max_new_tokens}, {start} taken)"
            )
        # Each row's last column: its first stop token, else the last one it may take; -1 for rows already done.
        last = torch.where(has_stop, is_stop.int().argmax(1), budget - 1).masked_fill_(~alive, -1)
        width = int(last.max().item()) + 1
        columns = torch.arange(width, device=self.device)
        written = columns <= last[:, None]  # Bool[B, width]: tokens the rows take
        ended = columns == last[:, None]
        tokens = torch.where(written, ids[:, :width], self._pad)
        generated = slice(self.prompt_width + start, self.prompt_width + start + width)
        self.input_ids[:, generated] = tokens
        self.attention_mask[:, generated] = written.long()
        self.num_generated.add_(written.sum(1))
        self._ended_steps[start : start + width] = ended.T
        stopped = (columns >= last[:, None]) & (alive & has_stop)[:, None]
        self._terminated_steps[start + 1 : start + width + 1] = self._terminated_steps[start] | stopped.T
        if start + width == self.max_new_tokens:
            self._truncated_steps[-1] = unended
        alive.zero_()
        self._steps = start + width
        if self._is_step_end is not None:
            boundary = self._is_step_end[tokens] & written & ~ended
            rows, step_columns = boundary.nonzero().unbind(1)  # row-major: each row's step ends in order
            self._credit_step_ends(rows, start + step_columns)
        # Scored in the order their rows end, as stepping would meet them.
        rows = ended.any(1).nonzero().flatten()
        rows = rows[torch.argsort(last[rows], stable=True)]
        self._finish(rows, start + last[rows])
        return self.results()

    def _check_token_ids(self, ids: torch.Tensor, name: str) -> None:
        """Raise ValueError naming the rows of ``ids`` (Long[B] or Long[B, T]) that hold anything but a token id."""
        vocab = self.single_action_space.n
        # An id past the tokenizer (a model's embedding table can be larger) would index the stop and step-end
        # tables out of range: an IndexError on CPU, a device-side assert on CUDA.
        if ids.numel() and (ids.max().item() >= vocab or ids.min().item() < 0):
            bad_entries = ((ids < 0) | (ids >= vocab)).reshape(self.num_envs, -1)
            bad = bad_entries.any(1).nonzero().flatten().tolist()[:8]
            first_bad = [ids.reshape(self.num_envs, -1)[row][bad_entries[row]][0].item() for row in bad]
            raise ValueError(f"{name} of rows {bad} are {first_bad}, not token ids in [0, {vocab})")

    def _response_texts(self, rows: torch.Tensor, lengths: list[int]) -> list[str]:
        """The decoded responses of ``rows`` (Long[N]), each its first ``lengths`` tokens, without a final stop token."""
        start = self.prompt_width
        responses = self.input_ids.index_select(0, rows)[:, start : start + max(lengths, default=0)].tolist()
        stop_ids = self._stop_id_set
        cut = [ids[:length] for ids, length in zip(responses, lengths)]
        return self.tokenizer.batch_decode(
            [ids[:-1] if ids[-1] in stop_ids else ids for ids in cut], skip_special_tokens=True
        )

    def _credit_step_ends(self, rows: torch.Tensor, steps: torch.Tensor) -> None:
        """Credit the reasoning step that each of ``rows`` (Long[N]) ended with its token of ``steps`` (Long[N];
        a row listed more than once in order of its steps)."""
        step_list = steps.tolist()
        texts = self._response_texts(rows, [step + 1 for step in step_list])
        self._credit_steps(rows.tolist(), step_list, texts, final=False)

    def _credit_steps(self, rows: list[int], steps: list[int], texts: list[str], final: bool) -> None:
        """Add the task's process reward for each row's newest finished reasoning step (its text so far in
        ``texts``) to the reward of its step in ``steps``."""
        for row, step, text in zip(rows, steps, texts):
            credited = self._credited_chars[row]
            value, self._credited_chars[row] = credit_newest_step(self.task, self.problems[row], text, credited, final)
            if self._credited_chars[row] != credited:  # a step ended here; a 0-reward step still counts (process advantages)
                self._process_step_mask[row, step] = True
            if value:
                self._process_rewards[row, step] = value
                self._reward_steps[step, row] += value

    def _finish(self, rows: torch.Tensor, last_steps: torch.Tensor) -> None:
        """Decode and score ``rows`` (Long[N]), ended on ``last_steps`` (Long[N]); a row's score is that step's reward."""
        row_list, step_list = rows.tolist(), last_steps.tolist()
        texts = self._response_texts(rows, [step + 1 for step in step_list])
        if self._is_step_end is not None:
            self._credit_steps(row_list, step_list, texts, final=True)
        problems = [self.problems[r] for r in row_list]
        results = rewards.score_batch(texts, [p.answer for p in problems], verifier=self._verifier,
                                      infos=[self.task.verifier_info(p) for p in problems], workers=self.score_workers)
        scores = torch.tensor([r.score for r in results], dtype=torch.float32, device=self.device)
        self.scores.index_copy_(0, rows, scores)
        self._reward_steps.index_put_((last_steps, rows), scores, accumulate=True)
        for row, text, result in zip(row_list, texts, results):
            self._completions[row], self._statuses[row] = text, result.status
            for name, value in result.details.get("components", {}).items():
                self._components.setdefault(name, [0.0] * self.num_envs)[row] = float(value)
        self._num_finished += len(row_list)
        self._warn_if_the_verifier_cannot_run(results)

    def _warn_if_the_verifier_cannot_run(self, results: list[rewards.VerifyResult]) -> None:
        """Once per env: a batch whose every row scored status "error" has a verifier that cannot run (a reward
        function called the wrong way, a missing package), not wrong answers; training on its zeros teaches nothing."""
        if self._warned_verifier_error or not self.all_done or any(s != rewards.ERROR for s in self._statuses):
            return
        self._warned_verifier_error = True
        warnings.warn(f"the verifier could not score any of the {len(self._statuses)} completions of this batch "
                      f"(status 'error', reward 0); the last said: {rewards.error_reason(results[-1])}",
                      rewards.VerifierErrorWarning, stacklevel=2)

    def results(self) -> RolloutResult:
        if not self.all_done or None in self._statuses:
            raise RuntimeError("results() needs a finished batch: step until all_done")
        end = self.prompt_width + self._steps
        return RolloutResult(
            prompt_ids=self.prompt_ids,
            prompt_mask=self.prompt_mask,
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
            process_rewards=self._process_rewards[:, : self._steps],
            process_step_mask=self._process_step_mask[:, : self._steps],
        )
