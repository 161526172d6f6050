"""What a run samples in, built from its config: the task (env.id with env.kwargs) and the TokenVectorEnv over it."""

from __future__ import annotations

import warnings

import torch

from algos.model.policy import stop_token_ids
from rlvr_env import TokenVectorEnv, make_task
from rlvr_env.multiturn_env import MultiTurnTask
from rlvr_env.registry import registered_tasks, resolve_id


def build_task(config, held_out: bool = False):
    """config.env.id built with env.kwargs (updated by env.eval_kwargs when ``held_out``); errors name those keys."""
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
        chat_template_kwargs=env_cfg.chat_template_kwargs,
        system_prompt=env_cfg.system_prompt,
        problem_seed=config.run.seed if problem_seed is None else problem_seed,
        stop_token_ids=None if model is None else stop_token_ids(model, tokenizer),
    )


def is_multiturn_task(env_id: str) -> bool:
    """Whether the task registered as ``env_id`` is a MultiTurnTask (its rollouts are whole episodes)."""
    return issubclass(registered_tasks()[resolve_id(env_id)][0], MultiTurnTask)
