"""Typed run configuration: sections as dataclasses, loaded from TOML/YAML, overridden from the CLI.

Precedence (later wins): dataclass defaults < algorithm preset < config file < `--key value`
overrides. A key is `section.field` (or just `field` when only one section has it; a section whose
`bare_keys` is False is always named, so its `steps` and `lr` leave `--steps` and `--lr` to run and optim).
Unknown keys and ill-typed values are errors that name the key; every section's
`validate()` raises ValueError naming the field.

The shared sections (model, env, rollout, run; optim and loss for training) are reused by every
algorithm; an algorithm's own file adds its section and presets (algos/algorithms/grpo.py's `grpo`,
algos/algorithms/ppo.py's `ppo`); a rollout engine's own file registers its section with the engine (static.py's
`static`, vllm.py's `vllm`: ENGINE_SECTIONS).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import math
import types
import typing
import warnings
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import tomllib
import torch
import yaml

from algos.core import LOSS_AGGREGATIONS, POLICY_LOSSES, ROLLOUT_CORRECTIONS
from algos.core.variants import Registry
from rlvr_env.curriculum import StepSchedule
from rlvr_env.prompting import validate_chat_template_kwargs
from rlvr_env.registry import registered_tasks, resolve_id
from rlvr_env.task import build_config

STRATEGIES = ("ddp", "fsdp2")  # distributed.strategy


def require(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise ValueError(f"config {name}: {message}")


@dataclass
class ModelConfig:
    path: str = "default"  # a local transformers directory, or "default" (embedded SmolLM2-135M-Instruct)
    dtype: str = "float32"  # training dtype; fp32 keeps CPU runs exact (bf16 halves memory)
    device: str = "auto"  # "auto" = cuda when available, else cpu
    # Mixed precision: forward/backward matmuls in this dtype under torch.autocast while the
    # weights and optimizer stay in `dtype` (TRL's bf16=True). None = off. "auto" (algos/system/hardware.py)
    # = bf16 where the device computes it natively (halves a step on AVX512-BF16/AMX CPUs and
    # Ampere+ GPUs), fp16 with loss scaling on older GPUs, off elsewhere (an AVX2 CPU emulates bf16
    # ~70x slower than fp32); config.yaml records what it resolved to.
    autocast: str | None = "auto"
    # Recompute each decoder layer in backward instead of keeping its activations (transformers' gradient
    # checkpointing, non-reentrant; TRL's gradient_checkpointing): a micro-batch's activation memory drops to
    # one layer's, for ~1/3 more compute and rows run whole (no prompt shared by a group: docs/agents.md).
    gradient_checkpointing: bool = False
    # The training forwards through decoder layers compiled by torch.compile (algos/model/compiled.py): fused kernels
    # for the launch-bound update on a GPU (an H200's went 0.37 -> 0.08 s), rows run whole. "auto" = "on" for a
    # one-process run on CUDA without gradient checkpointing, "off" elsewhere: a CPU's update is matmul-bound, and the
    # shared prompt saves it work (a 2-core AMX Xeon, bf16: 22.4 s compiled, 18.4 s eager); config.yaml records it.
    compile_layers: str = "auto"
    # Under a half-precision autocast over fp32 weights, move each trainable matrix weight that lies on that
    # precision's grid (a bf16 checkpoint's all do) by a fixed random amount inside half a grid step
    # (algos/model/dither.py): no forward changes, but the bf16 forwards then see updates smaller than a grid step
    # on average instead of not at all (the demo in bf16: docs/agents.md "bf16 and the demo's gain").
    dither_weights: bool = True

    def validate(self) -> None:
        require(self.compile_layers in ("auto", "on", "off"), "model.compile_layers",
                f"must be 'auto', 'on' or 'off', got {self.compile_layers!r}")
        require(not (self.compile_layers == "on" and self.gradient_checkpointing), "model.compile_layers",
                "'on' does not go with model.gradient_checkpointing (recomputing compiled layers is not tested; "
                "'auto' compiles none there)")
        require(self.dtype in ("float32", "bfloat16", "float16"), "model.dtype", f"unknown dtype {self.dtype!r}")
        require(self.autocast in (None, "auto", "bfloat16", "float16"), "model.autocast",
                 f"must be 'auto', null, 'bfloat16' or 'float16', got {self.autocast!r}")
        require(bool(self.path), "model.path", "must name a directory or 'default'")
        if self.device != "auto":
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError) as error:
                raise ValueError(f"config model.device: must be 'auto' or a torch device such as 'cpu' or 'cuda:0', "
                                 f"got {self.device!r} ({error})") from None


@dataclass
class EnvConfig:
    id: str = "rlvr/Arithmetic-v0"  # a registered rlvr task id
    kwargs: dict[str, Any] = field(default_factory=dict)  # task constructor arguments (e.g. difficulty)
    max_new_tokens: int = 64  # completion budget L_max (rows are truncated there)
    max_prompt_tokens: int | None = None  # None = the longest prompt of the batch
    use_chat_template: bool = True  # render prompts with the tokenizer's chat template
    # The chat template's own variables, e.g. {enable_thinking: false} for Qwen3 (TRL's and verl's
    # chat_template_kwargs), given to every rendering: rollouts, evaluation, warm start, DPO pairs. {} = none.
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    system_prompt: str | None = None
    eval_size: int = 100  # held-out problems for `rlvr eval` and periodic evaluation (a dataset: its first ones)
    eval_seed: int = 12345  # held-out problems of a procedural task come from a seed training never uses
    eval_batch_size: int = 64  # evaluation rows generated at once; 0 = all eval_size (a big test set's KV cache may not fit)
    # N > 0: each evaluation also samples N completions a problem (as rollouts sample: rollout.temperature) and logs
    # eval_pass@k (k = 1, 2, 4, ..., N; unbiased) and eval_maj@N, as `rlvr eval --samples N` (N times the greedy
    # evaluation's generation). 0 = greedy accuracy only. Reporting only: a resume may change it.
    eval_samples: int = 0
    # Task arguments for evaluation, over env.kwargs: a dataset task's held-out file (verl's data.val_files),
    # e.g. {data_path: gsm8k_test.jsonl}; without it a dataset task is evaluated on its training file.
    eval_kwargs: dict[str, Any] = field(default_factory=dict)
    # Task config fields ramped over the training steps, each {from, to, end_step[, start_step]} (linear; integers
    # when both ends are: rlvr_env.curriculum.StepSchedule), set on the training task before each step's rollouts,
    # a pure function of the step (a resume repeats it) and logged as schedule/<field>. E.g.
    # {few_shot_keep: {from: 1.0, to: 0.0, end_step: 40}} fades few-shot examples out (Arithmetic, GSM8K);
    # {format_weight: {from: 0.1, to: 0.0, end_step: 60}} withdraws format credit. Evaluation is never scheduled:
    # it scores env.kwargs updated by env.eval_kwargs. {} = none.
    schedule: dict[str, Any] = field(default_factory=dict)
    # A second held-out accuracy, eval_accuracy_transfer, logged wherever eval_accuracy is (before, every
    # run.eval_every steps, after), on the same problems under another prompt: the task built with env.kwargs,
    # then env.eval_kwargs, then these, e.g. {few_shot: []} (zero-shot: what `rlvr eval --zero-shot` scores).
    # {} with transfer_eval_chat_template null = no second evaluation. Reporting only: a resume may change it.
    transfer_eval_kwargs: dict[str, Any] = field(default_factory=dict)
    # env.use_chat_template of that second evaluation; null = the same as env.use_chat_template.
    transfer_eval_chat_template: bool | None = None

    def validate(self) -> None:
        require(self.max_new_tokens >= 1, "env.max_new_tokens", "must be >= 1")
        require(self.max_prompt_tokens is None or self.max_prompt_tokens >= 1, "env.max_prompt_tokens", "must be >= 1 or null")
        require(self.eval_size >= 1, "env.eval_size", "must be >= 1")
        require(self.eval_batch_size >= 0, "env.eval_batch_size", "must be >= 0 (0 = all at once)")
        require(self.eval_samples >= 0, "env.eval_samples", "must be >= 0 (0 = greedy accuracy only)")
        try:
            validate_chat_template_kwargs(self.chat_template_kwargs)
        except ValueError as error:
            raise ValueError(f"config env.{error}") from None

        try:
            schedule = StepSchedule(self.schedule, "env.schedule")
        except ValueError as error:
            raise ValueError(f"config {error}") from None
        for changes in schedule.endpoints():
            self._check_task_fields(changes, "env.schedule", self.kwargs)
        self._check_task_fields(self.transfer_eval_kwargs, "env.transfer_eval_kwargs", {**self.kwargs, **self.eval_kwargs})

    def has_transfer_eval(self) -> bool:
        """Whether runs log eval_accuracy_transfer: transfer_eval_kwargs or transfer_eval_chat_template is set."""
        return bool(self.transfer_eval_kwargs) or self.transfer_eval_chat_template is not None

    def _check_task_fields(self, changes: dict[str, Any], key: str, base: dict[str, Any]) -> None:
        """Refuse, naming ``key``, task config ``changes`` that env.id's config class has no field for or
        does not validate, on top of ``base``: before a run starts, not at its first step. Skipped when env.id
        or ``base`` alone is wrong (building the task reports those) and for ids this check cannot resolve."""
        if not changes:
            return

        try:
            task_cls, defaults = registered_tasks()[resolve_id(self.id)]
            build_config(task_cls.config_cls, None, {**defaults, **base})
        except Exception:  # noqa: BLE001 - an unknown id or bad env.kwargs: the task build names them
            return
        try:
            build_config(task_cls.config_cls, None, {**defaults, **base, **changes})
        except (TypeError, ValueError) as error:
            raise ValueError(f"config {key} {changes} on {self.id}: {error}") from None


@dataclass
class RolloutConfig:
    # How much each step samples, every algorithm's (it was grpo.prompts_per_step / grpo.group_size and
    # ppo.prompts_per_step / ppo.samples_per_prompt, still read: RENAMED_KEYS). Defaults: GRPO's and online DPO's
    # (DeepSeekMath samples 64 per prompt; 8 x 8 fits a CPU); PPOConfig's own are 16 x 1.
    prompts_per_step: int = 8  # prompts sampled per step, over all ranks (verl data.train_batch_size)
    # completions per prompt: GRPO's group G, PPO's samples per prompt, online DPO's candidates (TRL
    # num_generations, verl actor_rollout_ref.rollout.n)
    group_size: int = 8
    # "auto" (resolved at start-up, recorded in config.yaml): "static" on a GPU (single- and multi-turn), else "hf".
    # "hf": transformers + its KV cache, one row-compacting step per token (fastest on a CPU); "static": fixed-shape
    # decode steps replayed as CUDA graphs from a copy of the weights in the compute dtype (algos/rollout/static.py);
    # "vllm" (needs vllm installed); or an engine registered in ROLLOUT_ENGINES. An engine's own keys are the section
    # named as it is: static.decode_graph, vllm.gpu_memory_utilization (EngineSections).
    backend: str = "auto"
    temperature: float = 1.0  # sampling temperature; log-probs are computed at the same temperature
    top_p: float = 1.0  # nucleus sampling (1.0 = off, keeps log-probs on-policy)
    top_k: int = 0  # 0 = off
    # Multi-turn tasks (algos/rollout/multiturn.py): each episode's tokens after its initial prompt, the policy's and the tool
    # outputs' together; env.max_new_tokens bounds the policy's alone. None: twice env.max_new_tokens. Every
    # algorithm's (it was grpo.max_episode_tokens and ppo.max_episode_tokens, still read: RENAMED_KEYS).
    max_episode_tokens: int | None = None
    # Rollouts that overlap training (algos/run/rollout_pipeline.py; GRPO's family, PPO, online DPO): step t trains
    # on a batch drawn by the weights of step t - 1 - max_staleness, sampled on a thread of its own while the learner
    # updates, corrected by loss.rollout_correction. 0 = synchronous: each batch drawn by the current weights
    # (TRL's AsyncGRPO max_staleness, prime-rl's max_async_level, whose default is 2).
    max_staleness: int = 0

    def validate(self) -> None:
        require(self.prompts_per_step >= 1, "rollout.prompts_per_step", "must be >= 1")
        require(self.max_staleness >= 0, "rollout.max_staleness",
                f"must be >= 0 (0 = synchronous rollouts), got {self.max_staleness}")
        require(self.group_size >= 1, "rollout.group_size", "must be >= 1")
        require(self.max_episode_tokens is None or self.max_episode_tokens >= 1, "rollout.max_episode_tokens",
                "must be >= 1 or null")
        # the engines are algos/rollout/engines.py's ROLLOUT_ENGINES: a run checks the name before it loads its model
        require(isinstance(self.backend, str) and bool(self.backend), "rollout.backend",
                f"must name a rollout engine ('auto', 'hf', 'static', 'vllm', or one registered in ROLLOUT_ENGINES), "
                f"got {self.backend!r}")
        require(self.temperature > 0, "rollout.temperature", "must be > 0")
        require(0 < self.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
        require(self.top_k >= 0, "rollout.top_k", "must be >= 0")


@dataclass
class OptimConfig:
    lr: float = 1e-6  # DeepSeekMath's GRPO learning rate
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW defaults
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0  # clip the global grad norm (0 = off)
    warmup_steps: int = 0  # linear warm-up from 0 to lr
    schedule: str = "constant"  # after warm-up: "constant", "linear" or "cosine" decay to 0 at run.steps

    def validate(self) -> None:
        require(self.lr > 0, "optim.lr", f"must be > 0, got {self.lr}")  # finite: validate_sections checks every number
        require(self.adam_eps > 0, "optim.adam_eps", "must be > 0")
        require(self.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
        require(all(0 <= b < 1 for b in self.betas), "optim.betas", "each must be in [0, 1)")
        require(self.max_grad_norm >= 0, "optim.max_grad_norm", "must be >= 0")
        require(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
        require(self.schedule in ("constant", "linear", "cosine"), "optim.schedule", f"unknown {self.schedule!r}")


# The scores run.metric_for_best_model may name: the held-out evaluations every run logs (algos/run/loop.py)
BEST_MODEL_METRICS = ("eval_accuracy", "eval_accuracy_transfer")


@dataclass
class RunConfig:
    steps: int = 100  # optimizer steps (one rollout batch each)
    seed: int = 0
    output_dir: str = "runs/latest"  # checkpoints, metrics.jsonl, plots, TensorBoard events
    save_every: int = 50  # checkpoint every N steps (0 = only at the end)
    keep_last: int = 2  # checkpoints kept on disk
    eval_every: int = 0  # held-out greedy accuracy every N steps (0 = only before and after)
    tensorboard: bool = True  # when tensorboard is installed
    plots: bool = True  # PNG curves at the end (matplotlib)
    progress: bool = True  # live tqdm bar with key metrics
    # Rows of each step's first generation round written to output_dir/completions.jsonl: prompt, completion, answer,
    # score, status, reward components (TRL's log_completions, verl's rollout_data_dir); 0 = none.
    log_completions: int = 4
    # A fresh run in an output_dir holding an earlier run's checkpoints deletes them (as HF Trainer's
    # overwrite_output_dir); false = refuse to start there (resume it, or pick another output_dir).
    overwrite_output_dir: bool = False
    # transformers' enable_full_determinism (HF's full_determinism): deterministic CUDA kernels, synchronous launches,
    # warnings where an op has none. CPU runs and resumes repeat bitwise without it; GPU ones need it (and are slower).
    full_determinism: bool = False
    # A health alarm (algos/run/alarms.py, thresholds in the `alarms` section) saves a checkpoint and stops the run,
    # instead of only printing its line and logging alarm/<name> in metrics.jsonl.
    stop_on_alarm: bool = False
    # Keep the best model the run held (transformers' metric_for_best_model with load_best_model_at_end, as a
    # directory beside the last): "eval_accuracy" or "eval_accuracy_transfer" (env.transfer_eval_kwargs'); at every
    # held-out evaluation (before, after the warm start, every eval_every steps, the end) that scores higher than all
    # before it, the policy is written to output_dir/best_model (best.json: step, metric, value). None = off.
    metric_for_best_model: str | None = None

    def validate(self) -> None:
        require(self.steps >= 1, "run.steps", "must be >= 1")
        require(self.metric_for_best_model in (None, *BEST_MODEL_METRICS), "run.metric_for_best_model",
                f"must be one of {BEST_MODEL_METRICS} (held-out scores) or null, got {self.metric_for_best_model!r}")
        require(self.save_every >= 0, "run.save_every", "must be >= 0")
        require(self.log_completions >= 0, "run.log_completions", "must be >= 0 (0 = none)")
        require(self.keep_last >= 1, "run.keep_last", "must be >= 1")
        require(self.eval_every >= 0, "run.eval_every", "must be >= 0")


@dataclass
class PolicyLossConfig:
    """The policy's loss, shared by GRPO and PPO: the surrogate, its clipping, how per-token losses become one
    number, the entropy bonus, and the micro-batching that computes it (an algorithm's config may change the
    defaults; PPOConfig does)."""
    # POLICY_LOSSES: "ppo-clip" (the token ratio of PPO/GRPO/DAPO), "gspo" (GSPO's sequence ratio), "cispo" (MiniMax-M1's
    # clipped, detached importance weight on log pi), "gmpo" (the geometric mean of clipped token ratios; its eps_low and
    # eps_high bound the log-ratio: the paper's 0.4)
    surrogate: str = "ppo-clip"
    eps_low: float = 0.2  # clip(r, 1 - eps_low, 1 + eps_high): PPO's 0.2
    eps_high: float = 0.2  # DAPO's clip-higher: 0.28
    dual_clip: float | None = None  # c > 1 bounds negative-advantage loss at -c*A (Ye et al. 2020: 3); None = off
    # LOSS_AGGREGATIONS: GRPO's 1/|o_i| "seq-mean-token-mean"; DAPO's and PPO's "token-mean"; Dr. GRPO's "seq-mean-token-sum-norm"
    aggregation: str = "seq-mean-token-mean"
    entropy_coef: float = 0.0  # entropy bonus (0 = off; entropy is logged either way)
    # Rows per forward/backward; gradients accumulate exactly. "auto": on a CPU 8 rows (TRL's
    # per-device default, and the fastest measured there), on a GPU the most of the batch whose activations fit
    # micro_batch_memory_gb, or else half the memory the GPU has left (an H200's update of 64 rows took 1.55 s
    # in 8-row passes, 0.34 s in one: docs/performance.md). A number: at most that many rows.
    micro_batch_size: int | str = "auto"
    # A budget in GiB for the activations one forward keeps for backward (verl's dynamic batch size, in bytes):
    # rows per micro-batch = the most that fit, at most micro_batch_size, measured on each step's rows
    # (algos/learn/micro_batches.py, every algorithm's). None = micro_batch_size rows (on a GPU with "auto": half
    # its free memory).
    micro_batch_memory_gb: float | None = None
    logprob_chunk_size: int = 256  # tokens per LM-head chunk: 256 x 49k vocab x fp32 = 50 MB per V-wide tensor
    # Rollout/training mismatch correction, every algorithm's (algos/learn/rollout_correction.py; was grpo.*):
    # "tis" (per-token weights min(pi_old / pi_rollout, C)), "seq_mask" (each sequence's ratio, 0 outside [1/C, C]),
    # "none", or "auto": tis with an engine that samples from its own copy of the weights (vllm; TRL corrects
    # vLLM's samples by default), none with hf, whose log-probs are the trainer's up to float rounding. The mismatch
    # is logged either way whenever the backend returns log-probs.
    rollout_correction: str = "auto"
    rollout_correction_cap: float = 2.0  # C (verl's rollout_is_threshold 2; TRL's clip_max 3)

    def validate(self) -> None:
        require(self.surrogate in POLICY_LOSSES, "loss.surrogate", f"must be one of {POLICY_LOSSES.names}")
        require(self.rollout_correction in ("auto", "none", *ROLLOUT_CORRECTIONS.names), "loss.rollout_correction",
                f"must be one of {('auto', 'none', *ROLLOUT_CORRECTIONS.names)}, got {self.rollout_correction!r}")
        require(self.rollout_correction_cap > 1, "loss.rollout_correction_cap", "must be > 1")
        require(0 < self.eps_low <= 1, "loss.eps_low", "must be in (0, 1] (1: no lower bound on the ratio)")
        require(self.eps_high > 0, "loss.eps_high", "must be > 0")
        require(self.dual_clip is None or self.dual_clip > 1, "loss.dual_clip", "must be > 1 or null")
        require(self.dual_clip is None or self.surrogate in ("ppo-clip", "gspo"), "loss.dual_clip",
                f"bounds the clipped surrogate's loss; loss.surrogate {self.surrogate!r} has none: set it to null")
        require(self.aggregation in LOSS_AGGREGATIONS, "loss.aggregation", f"must be one of {LOSS_AGGREGATIONS.names}")
        require(self.entropy_coef >= 0, "loss.entropy_coef", "must be >= 0 (a bonus; negative would penalise entropy)")
        require(self.micro_batch_size == "auto" or (isinstance(self.micro_batch_size, int) and self.micro_batch_size >= 1),
                "loss.micro_batch_size", f"must be 'auto' or a number of rows >= 1, got {self.micro_batch_size!r}")
        require(self.micro_batch_memory_gb is None or self.micro_batch_memory_gb > 0, "loss.micro_batch_memory_gb",
                "must be > 0 (GiB) or null")
        require(self.logprob_chunk_size >= 1, "loss.logprob_chunk_size", "must be >= 1")


@dataclass
class DistributedConfig:
    """How a run launched with several processes (torchrun) shares its work; ignored by a one-process run."""
    # Recorded, not set: the processes the run was launched with (torchrun's WORLD_SIZE), written into config.yaml
    # by every run (a value given is replaced). The global batch is the config's whatever it is: the prompts are split
    # across the processes.
    world_size: int | None = None
    # "ddp": a full replica per rank, gradients all-reduced (the model, its gradients and AdamW's state fit one
    # device). "fsdp2": torch's fully_shard per decoder layer and the root; weights, gradients and optimizer state
    # sharded across ranks (what does not fit one device).
    strategy: str = "ddp"
    backend: str = "auto"  # torch.distributed backend: "auto" = nccl on CUDA, gloo on CPU
    timeout_s: float = 1800.0  # a collective waiting longer raises instead of hanging (torch's default: 10 min)
    # Split mode (algos/run/rollout_pipeline.py): the last rollout_ranks of torchrun's processes only generate (each
    # step's batch, by the weights rollout.max_staleness names, each learner sent its share with the version); the
    # others learn, under distributed.strategy among themselves. 0: every rank samples and learns.
    rollout_ranks: int = 0

    def validate(self) -> None:
        require(self.strategy in STRATEGIES, "distributed.strategy", f"must be one of {STRATEGIES}, got {self.strategy!r}")
        require(self.backend in ("auto", "gloo", "nccl"), "distributed.backend",
                f"must be 'auto', 'gloo' or 'nccl', got {self.backend!r}")
        require(self.timeout_s > 0, "distributed.timeout_s", "must be > 0")
        require(self.world_size is None or self.world_size >= 1, "distributed.world_size", "must be >= 1 or null")
        require(self.rollout_ranks >= 0, "distributed.rollout_ranks", f"must be >= 0, got {self.rollout_ranks}")


@dataclass
class AlarmConfig:
    """Thresholds of the health alarms (algos/run/alarms.py); 0 turns one off. run.stop_on_alarm stops the run on one."""
    # Entropy collapse: the policy's entropy below this fraction of its first step's, while reward_mean gained less
    # than `reward_stall` over the last `window` steps (a policy that stops exploring before it learns).
    entropy_collapse: float = 0.1
    reward_stall: float = 0.01
    window: int = 5  # steps the stall and hacking checks look back over
    # No signal: the share of groups whose rewards are all equal (zero_std_group_frac) at or above this.
    zero_std_groups: float = 0.95
    # Clip spike: clip_frac_low + clip_frac_high above this many times its mean over the previous `window` steps
    # (and above 0.05): the update moved far from the sampling policy.
    clip_spike: float = 5.0
    truncation: float = 0.9  # completions hitting env.max_new_tokens (truncation_rate) at or above this share
    # Reward hacking: reward_mean up by more than `reward_stall` over the window while held-out accuracy fell by more
    # than this from its best (checked at each evaluation).
    eval_drop: float = 0.05
    # Rollouts behind: under rollout.max_staleness >= 1, the learner waited for its batch (async/learner_wait_s) more
    # than this share of the step, on a step whose batch could have been drawn ahead (the first cannot).
    rollout_wait: float = 0.5
    # A verifier that cannot run (a reward function called the wrong way, a package missing in its workers): the share
    # of completions scored status "error" (status/error) at or above this. Model output alone rarely errs.
    verifier_errors: float = 0.5

    def validate(self) -> None:
        for name in ("entropy_collapse", "reward_stall", "zero_std_groups", "clip_spike", "truncation", "eval_drop",
                     "rollout_wait", "verifier_errors"):
            require(getattr(self, name) >= 0, f"alarms.{name}", "must be >= 0 (0 turns the alarm off)")
        require(self.window >= 1, "alarms.window", "must be >= 1")
        for name in ("entropy_collapse", "zero_std_groups", "truncation", "rollout_wait", "verifier_errors"):
            require(getattr(self, name) <= 1, f"alarms.{name}", "is a fraction: must be <= 1")


@dataclass
class WarmStartConfig:
    """A supervised warm start before RL (algos/run/warm_start.py, docs/warm_start.md): `steps` AdamW steps of cross-entropy on
    the task's demonstrations (Task.gold_messages) of training problems, on the policy's own tokens; RL, and its KL
    reference, then start from the warm-started weights. Its own optimizer: `lr` and optim's betas, eps, weight decay
    and max_grad_norm, constant rate; loss.micro_batch_size rows per forward."""
    bare_keys: ClassVar[bool] = False  # warm_start.steps, never --steps (run.steps)

    steps: int = 0  # optimizer steps; 0 = no warm start (every run before this section existed)
    lr: float = 2e-5  # TRL SFTConfig's learning_rate
    batch_size: int = 8  # demonstrations per step over all ranks (transformers' per_device_train_batch_size)

    def validate(self) -> None:
        require(self.steps >= 0, "warm_start.steps", "must be >= 0 (0 = no warm start)")
        require(self.lr > 0, "warm_start.lr", f"must be > 0, got {self.lr}")
        require(self.batch_size >= 1, "warm_start.batch_size", "must be >= 1")


@dataclass
class LoraConfig:
    """LoRA adapters through PEFT (algos/model/lora.py, docs/models_and_rollouts.md), with PEFT's own names: only the
    adapters train, the KL and DPO references are the base model with the adapter disabled (no second copy), and
    checkpoints hold the adapter in PEFT's format (`rlvr export --merge` writes the merged model)."""
    bare_keys: ClassVar[bool] = False  # lora.r, never --r

    r: int = 0  # rank (PEFT's r); 0 = off: full fine-tuning
    alpha: float = 32.0  # PEFT's lora_alpha: the update B @ A is scaled by alpha / r (2 at r = 16, as in TRL's examples)
    dropout: float = 0.0  # PEFT's lora_dropout; 0 keeps the rollout's and the trainer's log-probs alike
    # PEFT's target_modules: "all-linear" (PEFT's default spelling: every Linear but the LM head), or module names
    # or suffixes, e.g. [q_proj, k_proj, v_proj, o_proj]
    target_modules: list[str] | str = "all-linear"
    modules_to_save: list[str] = field(default_factory=list)  # PEFT's: modules trained in full beside the adapters

    def validate(self) -> None:
        require(self.r >= 0, "lora.r", f"must be >= 0 (0 = no LoRA), got {self.r}")
        require(self.alpha > 0, "lora.alpha", f"must be > 0, got {self.alpha}")
        require(0 <= self.dropout < 1, "lora.dropout", f"must be in [0, 1), got {self.dropout}")
        require(bool(self.target_modules), "lora.target_modules", "must name at least one module, or 'all-linear'")


# rollout.backend name -> the dataclass of that engine's own keys (algos/rollout/static.py's [static],
# vllm.py's [vllm]): a top-level section named as the engine, as an algorithm's is (grpo), in every config holding
# EngineSections. algos/rollout/engines.py's ROLLOUT_ENGINES.register fills it from RolloutEngine.section (this
# layer may not import the engines), so a new engine brings its keys with no edit here. Its keys are always named
# (static.decode_graph, never --decode_graph): registering an engine never makes a bare key ambiguous.
ENGINE_SECTIONS = Registry("engine section")


class EngineSections(dict[str, Any]):
    """Each registered engine's section (ENGINE_SECTIONS) by engine name, at its defaults unless given: config files,
    --key overrides and config.yaml hold them as top-level sections ([vllm]), the CLI lists them; only the engine
    rollout.backend names reads its own."""

    @classmethod
    def defaults(cls) -> EngineSections:
        return cls({name: section() for name, section in ENGINE_SECTIONS.items()})


@dataclass
class EvalConfig:
    """The sections every algorithm's config shares; all that `rlvr eval` reads."""
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    # [static], [vllm] and any registered engine's section, beside rollout in config.yaml: EngineSections
    engine_sections: EngineSections = field(default_factory=EngineSections.defaults)
    run: RunConfig = field(default_factory=RunConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    def validate(self) -> None:
        validate_sections(self)
        require(self.run.metric_for_best_model != "eval_accuracy_transfer" or self.env.has_transfer_eval(),
                "run.metric_for_best_model",
                "eval_accuracy_transfer is scored only when env.transfer_eval_kwargs (or env.transfer_eval_chat_template) "
                "sets a second evaluation")


@dataclass
class TrainConfig(EvalConfig):
    """The sections every training algorithm shares: the evaluation ones plus `optim`, `loss`, `alarms`,
    `warm_start` and `lora`."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    alarms: AlarmConfig = field(default_factory=AlarmConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)

    def validate(self) -> None:
        super().validate()
        # AdamW's eps (1e-8) is 0 in float16, so a zero gradient gives 0/0 = NaN weights after one step that looks
        # applied (finite grad norm); and GradScaler refuses to unscale float16 gradients under float16 autocast.
        require(self.model.dtype != "float16", "model.dtype",
                 "float16 weights cannot be trained: use model.dtype = float32 with model.autocast = float16 (or bfloat16)")


def sections(config: Any) -> list[tuple[str, Any]]:
    """(name, section) for each section of a config instance, named and ordered as its files hold them: its dataclass
    fields, its EngineSections field giving each engine's."""
    found: list[tuple[str, Any]] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, EngineSections):
            found += value.items()
        elif dataclasses.is_dataclass(value):
            found.append((f.name, value))
    return found


def validate_sections(config: Any) -> None:
    """Call validate() on every section of a config dataclass, after refusing any non-finite number
    (no setting means inf or nan: an infinite ppo.vf_coef would skip every update as non-finite)."""
    for name, section in sections(config):
        for key in dataclasses.fields(section):
            value = getattr(section, key.name)
            if isinstance(value, float):
                require(math.isfinite(value), f"{name}.{key.name}", f"must be a finite number, got {value}")
        if hasattr(section, "validate"):
            section.validate()


# ---------------------------------------------------------------- loading


def load_file(path: str | Path) -> dict[str, Any]:
    """A TOML (.toml) or YAML (.yaml/.yml) file -> nested dict."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    if path.suffix == ".toml":
        with path.open("rb") as fh:
            try:
                return tomllib.load(fh)
            except tomllib.TOMLDecodeError as error:
                raise ValueError(f"config file {path}: not valid TOML ({error})") from None
    if path.suffix in (".yaml", ".yml"):
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as error:
            raise ValueError(f"config file {path}: not valid YAML ({error})") from None
        if not isinstance(data, dict):
            raise ValueError(f"config file {path}: top level must be a mapping, got {type(data).__name__}")
        return data
    raise ValueError(f"config file {path}: unknown format {path.suffix!r} (use .toml, .yaml or .yml)")


def parse_overrides(args: list[str]) -> dict[str, str]:
    """['--grpo.beta', '0', '--lr=1e-5'] -> {'grpo.beta': '0', 'lr': '1e-5'} (values stay strings)."""
    overrides: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or arg == "--":
            raise ValueError(f"expected a --key value override, got {arg!r}")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise ValueError(f"override --{key} has no value")
            value = args[i + 1]
            i += 1
        overrides[key.replace("-", "_")] = value
        i += 1
    return overrides


def _resolve_key(cls: type, key: str) -> list[str]:
    """A dotted or bare key -> the path of field names; bare keys must match one section's field."""
    parts = key.split(".")
    if len(parts) > 1:
        return parts
    top = {f.name for f in dataclasses.fields(cls)}
    if key in top:
        return parts
    hints = typing.get_type_hints(cls)
    owners = [name for name in hints if dataclasses.is_dataclass(hints[name]) and key in _field_names(hints[name])
              and getattr(hints[name], "bare_keys", True)]
    if len(owners) == 1:
        return [owners[0], key]
    if not owners:
        classes = _section_classes(cls)
        keys = [f"{section}.{name}" for section, section_cls in classes.items() for name in _field_names(section_cls)]
        raise _unknown_key(key, keys, f"a key is section.field; sections: {', '.join(classes)}")
    raise ValueError(f"config key {key!r} is ambiguous: use one of {', '.join(o + '.' + key for o in owners)}")


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _engine_sections_field(cls: type) -> str | None:
    """The name of ``cls``'s EngineSections field, if it has one: its keys are the registered engines' names."""
    hints = typing.get_type_hints(cls)
    return next((f.name for f in dataclasses.fields(cls) if hints[f.name] is EngineSections), None)


def _section_classes(cls: type) -> dict[str, type]:
    """Section name -> its dataclass, for each section of config class ``cls``, named and ordered as ``sections``."""
    classes: dict[str, type] = {}
    for name, tp in typing.get_type_hints(cls).items():
        if tp is EngineSections:
            classes.update(ENGINE_SECTIONS)
        elif dataclasses.is_dataclass(tp):
            classes[name] = tp
    return classes


def _unknown_key(key: str, known: list[str], listing: str) -> ValueError:
    """The error for an unknown ``key``: the ``known`` keys whose last part is close to its own (a typo), then ``listing``."""
    by_name: dict[str, list[str]] = {}
    for known_key in known:
        by_name.setdefault(known_key.rpartition(".")[2], []).append(known_key)
    close = [k for name in difflib.get_close_matches(key.rpartition(".")[2], by_name) for k in by_name[name]]
    guess = f"did you mean {' or '.join(close)}? " if close else ""
    return ValueError(f"unknown config key {key!r} ({guess}{listing})")


def _set_dotted(data: dict, path: list[str], value: Any) -> None:
    for part in path[:-1]:
        child = data.setdefault(part, {})
        if isinstance(child, str):  # a mapping field given on the command line as flow YAML, e.g. {digits: 3}
            child = data[part] = _flow_yaml(child, ".".join(path[: path.index(part) + 1]))
        if not isinstance(child, dict):
            raise ValueError(f"config key {'.'.join(path)!r}: {part!r} is not a section or a mapping")
        data = child
    data[path[-1]] = value


def _flow_yaml(text: str, key: str) -> Any:
    """A command-line value in JSON/YAML flow syntax; ValueError naming the key when it does not parse."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ValueError(f"config key {key!r}: {text!r} is not valid YAML flow syntax ({str(error).splitlines()[0]})") from None


def _cli_scalar(text: str) -> Any:
    """A command-line value inside a mapping field (env.kwargs.digits 3): YAML numbers, booleans,
    null and flow collections are typed; anything else (e.g. the operators "+-*/") stays a string."""
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    scalar = parsed is None or isinstance(parsed, (bool, int, float))
    return parsed if scalar or text.lstrip().startswith(("[", "{")) else text


def _merge(base: dict, update: dict) -> dict:
    """Deep merge into a new dict; neither input is modified (presets are shared module constants)."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check (and, for CLI strings, convert) one value against a field's type hint."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in options:
                return None
        containers = tuple(o for o in options if typing.get_origin(o) in (tuple, list, dict))
        if containers and isinstance(value, str) and isinstance(_cli_scalar(value), (list, dict)):
            options = containers  # "[q_proj, 3]" is a list with a bad item, not a name
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(errors[0] if errors else f"config key {key!r}: got {value!r}")
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ValueError(f"config key {key!r}: expected true/false, got {value!r}")
    if tp in (int, float):
        if isinstance(value, bool):
            raise ValueError(f"config key {key!r}: expected {tp.__name__}, got {value!r}")
        if isinstance(value, (int, float)) and (tp is float or float(value).is_integer()):
            return tp(value)
        if isinstance(value, str):
            try:
                return tp(value) if tp is float else int(value)
            except ValueError:
                pass
        raise ValueError(f"config key {key!r}: expected {tp.__name__}, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"config key {key!r}: expected a string, got {value!r}")
    if origin in (tuple, list, dict):
        if isinstance(value, str):  # from the command line: JSON/YAML flow syntax, e.g. [0.9,0.95] or {a: 1}
            value = _flow_yaml(value, key)
        args = typing.get_args(tp)
        if origin is dict:
            if not isinstance(value, dict):
                raise ValueError(f"config key {key!r}: expected a mapping, got {value!r}")
            return dict(value)
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"config key {key!r}: expected a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ValueError(f"config key {key!r}: expected {len(args)} items, got {len(value)}")
            return tuple(_coerce(v, a, key) for v, a in zip(value, args))
        item_type = args[0] if args else Any
        return origin(_coerce(v, item_type, key) for v in value)
    raise ValueError(f"config key {key!r}: unsupported type {tp!r}")


def from_dict(cls: type, data: dict[str, Any], prefix: str = "", defaults: Any = None) -> Any:
    """Nested dict -> dataclass instance; unknown keys and wrong types raise ValueError naming the key. Fields the dict
    leaves out keep ``defaults``' values when given (a section's defaults as its config sets them: PPOConfig's `loss`
    aggregates by token-mean), else the class defaults."""
    if not isinstance(data, dict):
        raise ValueError(f"config section {prefix.rstrip('.') or '<root>'!r} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    engines_field = _engine_sections_field(cls)
    engines = {key: value for key, value in data.items() if engines_field and key in ENGINE_SECTIONS and key not in fields}
    known = [name for name in fields if name != engines_field] + list(ENGINE_SECTIONS if engines_field else ())
    for key in data:
        if key not in known:
            raise _unknown_key(prefix + key, [prefix + name for name in known], f"known: {', '.join(sorted(known))}")
    kwargs = {}
    if engines:
        given = {name: from_dict(ENGINE_SECTIONS[name], values, f"{prefix}{name}.") for name, values in engines.items()}
        kwargs[engines_field] = EngineSections({**EngineSections.defaults(), **given})
    for name, value in data.items():
        if name in engines:
            continue
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            factory = fields[name].default_factory
            section_defaults = factory() if factory is not dataclasses.MISSING else None
            kwargs[name] = from_dict(tp, value, prefix + name + ".", section_defaults)
        else:
            kwargs[name] = _coerce(value, tp, prefix + name)
    return dataclasses.replace(defaults, **kwargs) if defaults is not None else cls(**kwargs)


def describe_sections(*configs: Any, leave_out: Collection[str] = ()) -> str:
    """Each section of the config instances, once (as the first config that has it sets it), and under it one line per
    key: its name, type and value, what `rlvr train --help` lists (the comments in this file say what each key does).
    ``leave_out``: dotted keys the command does not read (greedy evaluation's sampling keys)."""
    listed: dict[str, list[tuple[str, str, str]]] = {}  # section -> [(key, type, value as JSON)]
    for config in configs:
        for name, section in sections(config):
            if name not in listed:
                hints = typing.get_type_hints(type(section))
                listed[name] = [(f.name, _type_name(hints[f.name]), json.dumps(getattr(section, f.name)))
                                for f in dataclasses.fields(section) if f"{name}.{f.name}" not in leave_out]
    rows = [row for section_rows in listed.values() for row in section_rows]
    name_width, type_width = (max((len(row[column]) for row in rows), default=0) for column in (0, 1))
    lines = []
    for section, section_rows in listed.items():
        lines.append(f"{section}:")
        lines += [f"  {name:<{name_width}}  {type_name:<{type_width}}  {value}" for name, type_name, value in section_rows]
    return "\n".join(lines)


def _type_name(tp: Any) -> str:
    """``int``, ``str | None``, ``dict[str, Any]``: a type hint as it is written in this file."""
    return tp.__name__ if isinstance(tp, type) and not typing.get_args(tp) else str(tp).replace("typing.", "")


def to_dict(config: Any) -> dict[str, Any]:
    """Config dataclass -> plain nested dict of its sections (tuples become lists), for saving and logging."""
    return json.loads(json.dumps({name: dataclasses.asdict(section) for name, section in sections(config)}))


# Keys that moved: old dotted key -> its new one. Config files, CLI flags and an old checkpoint's config.yaml
# (--resume) still say the old one for a release; each is read as the new key, with a FutureWarning.
# Kept until the first release, 0.2.0: run directories written before the renames must still resume.
RENAMED_KEYS = {
    "grpo.prompts_per_step": "rollout.prompts_per_step",
    "ppo.prompts_per_step": "rollout.prompts_per_step",
    "grpo.group_size": "rollout.group_size",
    "ppo.samples_per_prompt": "rollout.group_size",
    "grpo.max_episode_tokens": "rollout.max_episode_tokens",
    "ppo.max_episode_tokens": "rollout.max_episode_tokens",
    "grpo.rollout_correction": "loss.rollout_correction",
    "grpo.rollout_correction_cap": "loss.rollout_correction_cap",
    # the engines' own keys, now in their engines' sections (ENGINE_SECTIONS)
    "rollout.decode_graph": "static.decode_graph",
    "rollout.vllm_gpu_memory_utilization": "vllm.gpu_memory_utilization",
    "rollout.vllm_dtype": "vllm.dtype",
    "rollout.vllm_engine_kwargs": "vllm.engine_kwargs",
}


def _renamed(key: str) -> str:
    new = RENAMED_KEYS.get(key)
    if new is None:
        return key
    warnings.warn(f"config key {key} is now {new}: the old name is read for one more release", FutureWarning,
                  stacklevel=3)
    return new


def with_renamed_keys(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (nested sections) with every RENAMED_KEYS old key moved to its new place; the same value under both
    names is fine, two different ones are an error naming both."""
    data = copy.deepcopy(data)
    for old, new in RENAMED_KEYS.items():
        old_section, old_name = old.split(".")
        if not isinstance(data.get(old_section), dict) or old_name not in data[old_section]:
            continue
        value = data[old_section].pop(old_name)
        new_section, new_name = _renamed(old).split(".")
        held = data.setdefault(new_section, {})
        if new_name in held and held[new_name] != value:
            raise ValueError(f"config {old} = {value!r} and {new} = {held[new_name]!r}: {old} is the old name of "
                             f"{new}; keep {new} only")
        held[new_name] = value
    return data


def load_config(
    cls: type,
    path: str | Path | None = None,
    overrides: dict[str, str] | list[str] | None = None,
    preset: dict[str, Any] | None = None,
    unused_sections: Collection[str] = (),
) -> Any:
    """Build and validate `cls` from defaults < preset < file at `path` < CLI overrides.
    `unused_sections`: top-level sections of the file that `cls` does not have and that are set aside
    (a training run's `optim` and `grpo` when `rlvr eval` reads its config.yaml); any other unknown key is an error."""
    data: dict[str, Any] = _merge({}, preset or {})
    if path is not None:
        data = _merge(data, with_renamed_keys({k: v for k, v in load_file(path).items() if k not in unused_sections}))
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    for key, value in (overrides or {}).items():
        path = _resolve_key(cls, _renamed(key))
        # Deeper than section.field: a key inside a mapping field, which has no type hint to convert to.
        _set_dotted(data, path, _cli_scalar(value) if len(path) > 2 and isinstance(value, str) else value)
    config = from_dict(cls, data)
    config.validate()
    return config


def save_config(config: Any, path: str | Path) -> None:
    """Write a config as YAML that load_config reads back to an equal config."""
    Path(path).write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
