"""RunSetup: what a trainer starts from (the policy, its reference, the env and backend, the run directory) and what
it does with them between its own collect and update: wrap the trained modules, run the reference, sample a generation
round (round_seed), restore and save checkpoints. algos/run/loop.py's setup_run builds it; the loop and the warm start
(algos/run/warm_start.py) take it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from algos.model.lora import adapter_disabled
from algos.rollout import RolloutBackend, row_seeds
from algos.run import checkpoint as ckpt
from algos.run.reporting import CompletionLog
from algos.system.distributed import TrainingForward, World, whole_weights, wrap
from algos.system.runtime import DTYPES, build_optimizer, build_scheduler
from rlvr_env.curriculum import StepSchedule
from rlvr_env.token_vector_env import draw_problem_indices


@dataclass
class RunSetup:
    """What a trainer starts from: the policy and its frozen reference, the env and backend it samples with,
    the held-out evaluation set, and the run directory with the checkpoint to resume (None: step 0)."""
    config: Any
    device: torch.device
    model: torch.nn.Module
    tokenizer: Any
    # The KL anchor, when asked for: a frozen copy of the initial weights, or under LoRA the policy itself, which the
    # trainers run with its adapter disabled (algos.model.lora.adapter_disabled)
    ref_model: torch.nn.Module | None
    env: Any  # rlvr_env.TokenVectorEnv
    backend: RolloutBackend
    eval_set: tuple[Any, list[int] | None]  # (task, problem indices): algos.run.evaluation.eval_task
    scaler: torch.amp.GradScaler
    output_dir: Path
    checkpoint: Path | None
    world: World
    schedule: StepSchedule  # env.schedule: the task's config at each step (a pure function of the step)
    modules: TrainingForward | None = None  # what the trainer trains (wrap): the policy, and PPO's critic
    # run.log_completions' file, written by the one process that draws learner rank 0's batches (rollout rank 0 in
    # split mode, where several rollout ranks take turns); None: no log
    completions: CompletionLog | None = None
    forward: torch.nn.Module | None = None  # ``modules`` as DDP or FSDP2 wraps them (``modules`` in one process)

    def wrap(self, some_frozen: bool = False, **modules: torch.nn.Module) -> torch.nn.Module:
        """Hold the trained ``modules`` (policy=..., critic=...) in one TrainingForward and wrap it as
        distributed.strategy says (``some_frozen``: see algos.system.distributed.wrap); build the optimizer after this
        (FSDP2 replaces the parameters)."""
        autocast = self.config.model.autocast
        fsdp_dtype = DTYPES[autocast] if autocast and self.config.distributed.strategy == "fsdp2" else None
        self.modules = TrainingForward(**modules)
        self.forward = wrap(self.modules, self.world, self.config.distributed.strategy, self.device, fsdp_dtype,
                            some_frozen)
        return self.forward

    def reference(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        """``function(*args, **kwargs)`` run on the KL reference: the frozen copy as it is, or a LoRA policy (the
        reference is then the policy itself) with its adapter disabled, through the wrapped forward, so that FSDP2
        gathers the policy's shards for it."""
        with adapter_disabled(self.ref_model):
            if self.ref_model is self.model:
                return self.forward(function, *args, **kwargs)
            return function(*args, **kwargs)

    def round_prompts(self, seed: int, prompts: int, group_size: int) -> tuple[list[int], list[int]]:
        """(this rank's problem indices, its rows' sampling seeds) of a generation round of ``prompts`` prompts x
        ``group_size``: every rank draws the round's prompts from ``seed`` and takes its share, and every row's samples
        come from its own seed, so the round's rows are those of one process whatever the number of ranks."""
        from gymnasium.utils import seeding

        mine = self.world.span(prompts)
        problems = draw_problem_indices(seeding.np_random(seed)[0], self.env.task.size, prompts)
        return problems[mine.start : mine.stop], row_seeds(seed, range(mine.start * group_size, mine.stop * group_size))

    def sample(self, backend: RolloutBackend, step: int, round_index: int = 0, policy: torch.nn.Module | None = None):
        """One generation round of ``step``: this rank's share of rollout.prompts_per_step prompts, rollout.group_size
        completions each, of the task as env.schedule sets it for ``step``, drawn by ``backend`` from ``policy``
        (default: the policy, its whole weights under FSDP2; algos/run/rollout_pipeline.py passes its own copy) -> the
        backend's Rollout. Seeds come from (run.seed, step, round_index) alone (round_seed), so a resume draws the
        same. Round 0's first rows go to completions.jsonl (run.log_completions) where this process keeps it."""
        r = self.config.rollout
        scheduled = self.schedule.at(step)
        if scheduled:
            self.env.task.configure(**scheduled)
        seed = round_seed(self.config.run.seed, step, round_index)
        problems, seeds = self.round_prompts(seed, r.prompts_per_step, r.group_size)
        self.env.reset(seed=seed, options={"group_size": r.group_size, "problem_indices": problems})
        if policy is not None:
            result = backend.generate(policy, self.env, seeds=seeds)
        else:
            with whole_weights(self.forward):
                result = backend.generate(self.model, self.env, seeds=seeds)
        if self.completions is not None and round_index == 0:
            self.completions.write(step, result)
        return result

    def optimization(self, groups: list[dict[str, Any]] | None = None,
                     delays: tuple[int, ...] = ()) -> tuple[torch.optim.Optimizer, Any, int, dict[str, Any]]:
        """AdamW over the trained modules' trainable weights (or over ``groups``, each with its own settings), its
        schedule over run.steps (``delays``: steps before each group's schedule starts), and where to start (a
        resumed run's weights, optimizer, schedule, scaler and RNGs restored): (optimizer, scheduler, step to
        continue after, the algorithm's own saved state, {} for a fresh run). Every trainer starts so."""
        optimizer = build_optimizer(self.modules if groups is None else groups, self.config.optim)
        scheduler = build_scheduler(optimizer, self.config.optim, self.config.run.steps, delays=delays)
        return optimizer, scheduler, *self.restore(optimizer, scheduler)

    def restore(self, optimizer: torch.optim.Optimizer, scheduler) -> tuple[int, dict[str, Any]]:
        """(step to continue after, the algorithm's own saved state): the checkpoint loaded into the trained
        modules, optimizer, scheduler, grad scaler and RNGs, or (0, {}) for a fresh run."""
        if self.checkpoint is None:
            return 0, {}
        loaded = ckpt.load_checkpoint(self.checkpoint, model=self.modules, optimizer=optimizer, scheduler=scheduler)
        # A scaler's state exists only under fp16 autocast; a run resumed in another precision starts its own.
        if self.scaler.is_enabled() and loaded["state"]["grad_scaler"]:
            self.scaler.load_state_dict(loaded["state"]["grad_scaler"])
        return loaded["step"], loaded["state"]

    def save(self, step: int, optimizer: torch.optim.Optimizer, scheduler, state: dict[str, Any] | None = None) -> Path:
        """checkpoint-<step> with the trained modules, optimizer, scheduler, grad scaler, config and the algorithm's
        ``state``; the policy as a transformers directory. Every rank calls it."""
        return ckpt.save_checkpoint(
            self.output_dir, step, model=self.modules, optimizer=optimizer, scheduler=scheduler, tokenizer=self.tokenizer,
            state={"grad_scaler": self.scaler.state_dict(), **(state or {})}, keep_last=self.config.run.keep_last,
            config=self.config, export=self.model,
        )


def round_seed(seed: int, step: int, round_index: int = 0) -> int:
    """The env seed of a step's generation round: a pure function of (run.seed, step, round), so a resumed run
    sees the same prompts; distinct for every round below 101 (GRPO's grpo.max_sampling_rounds <= 101)."""
    return (seed * 1_000_003 + step) * 101 + round_index
