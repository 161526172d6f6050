"""A run's config resolved once, before anything loads (resolve_run_config): every "auto" and every alias replaced by
what this run, on this machine, uses. The result is a copy; the config given is left as it was. config.yaml records
the copy, so the file replays the run, and setup_run (loop.py) loads the model, the task and the engine from it."""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from algos.model.compiled import resolve_compile_layers
from algos.model.loading import DEFAULT_MODEL_ALIAS, load_model_config, resolve_model_path
from algos.rollout import ROLLOUT_ENGINES, engine_for_model, resolve_rollout_backend
from algos.system.distributed import World, broadcast_to_launch, device_for, launched_world
from algos.system.hardware import resolve_precision
from algos.system.runtime import resolve_device
from rlvr_env.registry import spelled_id


@dataclass(frozen=True)
class ResolvedRun:
    """A config with nothing left to pick, the device it runs on, and what the machine was found to be."""
    config: Any  # the copy: model.path, env.id, rollout.backend, model.autocast, model.compile_layers and
    # distributed.world_size as this run uses them
    device: torch.device
    machine: dict[str, Any]  # machine.json: the machine, the precision and why, the attention kernels, compiled layers


def resolve_run_config(config: Any, world: World, *, custom_backend: bool = False) -> ResolvedRun:
    """Resolve a validated ``config`` for this process of ``world`` from the model's transformers config alone (no
    weights are read): the device; model.path (a run or checkpoint directory -> the model directory it names) and
    env.id (its one spelling); rollout.backend "auto" (the device's engine, "hf" for a model that engine refuses);
    model.autocast "auto" (what this machine computes fast on the model's own shapes, as rank 0 measured it);
    model.compile_layers "auto"; distributed.world_size. ``custom_backend``: the caller samples with a backend of its
    own, so the named engine need not be installed."""
    resolved = copy.deepcopy(config)
    resolved.distributed.world_size = launched_world().size  # how the run ran: a resume may run on another number
    device = resolve_device(device_for(world, resolved.model.device))
    record_resolved_names(resolved)
    model_config = load_model_config(resolved.model.path)
    picked_engine = resolved.rollout.backend == "auto"
    engine = resolve_rollout_backend(resolved, device)
    if picked_engine:  # "auto" gives way to "hf" for a model its pick cannot sample exactly
        engine = engine_for_model(resolved, model_config)
    if not custom_backend:
        ROLLOUT_ENGINES[engine].check_available(engine)
    machine = resolve_precision(resolved, device, model_config)
    resolved.model.autocast = broadcast_to_launch(resolved.model.autocast)  # every rank computes as rank 0 measured
    resolved.model.compile_layers = resolve_compile_layers(resolved.model.compile_layers, device, world_size=world.size,
                                                           gradient_checkpointing=resolved.model.gradient_checkpointing)
    machine["compiled_layers"] = resolved.model.compile_layers == "on"
    return ResolvedRun(config=resolved, device=device, machine=machine)


def record_resolved_names(config: Any) -> None:
    """Write into ``config`` what its names resolve to now, so the saved config.yaml replays this run: a model.path
    that is a checkpoint or run directory becomes the model directory it names (so the KL reference, a resume and
    vllm keep these weights when that other run saves newer checkpoints), env.id its one spelling."""
    model_dir = resolve_model_path(config.model.path)
    if config.model.path != DEFAULT_MODEL_ALIAS and Path(config.model.path).expanduser().resolve() != model_dir.resolve():
        warnings.warn(f"model.path {config.model.path} resolves to {model_dir}; the run records that", stacklevel=4)
        config.model.path = str(model_dir)
    config.env.id = spelled_id(config.env.id)  # "arithmetic" -> "rlvr/Arithmetic-v0"; a task module's "mod:" kept
