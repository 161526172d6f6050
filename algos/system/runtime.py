"""Where and how a run computes: device, precision, seeding, AdamW and its schedule, and the
NaN-guarded optimizer step. Nothing here knows about models' heads, tasks or algorithms."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import math
import random
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.autograd.graph import increment_version

from algos.config import ModelConfig, OptimConfig

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


@contextlib.contextmanager
def weights_cast_once(device_type: str) -> Iterator[None]:
    """Inside an autocast region, a block whose weights do not change (a rollout) casts each weight to the half
    dtype once instead of at every forward: a decode step of SmolLM2-135M otherwise re-casts all 135M weights.
    The cast cache is cleared on exit, so the next forward sees the next update's weights."""
    if not torch.is_autocast_enabled(device_type):
        yield
        return
    try:
        with torch.autocast(device_type, dtype=torch.get_autocast_dtype(device_type), cache_enabled=True):
            yield
    finally:
        torch.clear_autocast_cache()  # an inner autocast's exit keeps it (only the outermost clears)


def compute_dtype(model_cfg: ModelConfig) -> str:
    """The dtype a run's matmuls compute in: model.autocast when set (resolved: never "auto"), else model.dtype."""
    if model_cfg.autocast is not None and model_cfg.autocast not in DTYPES:  # "auto" is resolved once per run
        raise ValueError(f"model.autocast {model_cfg.autocast!r} must be resolved first: algos.system.hardware.resolve_precision")
    return model_cfg.autocast or model_cfg.dtype


def mixed_precision(model_cfg: ModelConfig, device: torch.device) -> contextlib.AbstractContextManager:
    """torch.autocast to model.autocast's dtype around rollouts and updates, or a no-op when it is None.

    The weight-cast cache is off here: it lives until the outermost autocast exits, so across a training
    loop every forward would reuse the half-precision copies made at the first forward, before any
    update (tests/test_grpo_loop.py). Blocks whose weights stay fixed turn it on for themselves
    (weights_cast_once: a rollout, one gradient accumulation).
    """
    if model_cfg.autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[compute_dtype(model_cfg)], cache_enabled=False)


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library is not glibc (macOS, musl)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_memory() -> None:
    """Give the C heap's free pages back to the OS. glibc keeps what CPU tensors free (a rollout's KV cache, an
    update's activations and gradients) in the process: measured on SmolLM2-135M's GRPO step, ~0.9 GB of RSS carried
    from one phase into the next, on top of the next phase's own peak."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


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
    # One fused kernel per step instead of ~10 tensor ops per parameter, each allocating its result: on the 2-core
    # Intel Xeon, 134.5M parameters stepped in 0.09 s instead of 0.38 s (docs/performance.md).
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay,
                             fused=True)


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
        # FSDP2: a DTensor holding the norm over every rank's shards, the same on each rank
        grad_norm = (norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item()
    else:
        grad_norm = 0.0
    applied = loss_finite and math.isfinite(grad_norm)
    if applied:
        optimizer.step()
        # A fused step writes the weights inside its kernel, leaving their version counters (which tell a vLLM
        # rollout its copy is stale) where they were.
        increment_version([p for group in optimizer.param_groups if group.get("fused") for p in group["params"]])
    if scaling:
        scaler.update()  # reads the overflow flags unscale_ recorded
    optimizer.zero_grad(set_to_none=True)
    release_free_memory()  # the gradients just freed
    return StepOutcome(applied=applied, grad_norm=grad_norm)
