"""Held-out evaluation: greedy accuracy on problems training never samples (a procedural task's
from env.eval_seed; a dataset's first env.eval_size, from env.eval_kwargs' file when set)."""

from __future__ import annotations

import dataclasses
import warnings

import torch

from algos.model.loading import load_policy
from algos.rollout import build_task, make_env, make_rollout_backend
from algos.run.resolve import resolve_run_config
from algos.system.distributed import current_world, init_distributed, sum_over_ranks
from algos.system.runtime import DTYPES, mixed_precision
from rlvr_env.data import DatasetTask
from rlvr_env.token_vector_env import draw_problem_indices


def eval_task(config):
    """(task, problem indices) of evaluation: config.env.id built with env.kwargs updated by env.eval_kwargs;
    a dataset's first env.eval_size problems, each once (all of them when it has fewer), or None for a
    procedural task, whose problems are drawn from the seed env.eval_seed that training never uses."""
    task = build_task(config, held_out=True)
    return task, None if task.size is None else list(range(min(config.env.eval_size, task.size)))


# What `rlvr eval --zero-shot` and a transfer evaluation of {few_shot: []} change: the task's worked examples go.
ZERO_SHOT_KWARGS = {"few_shot": []}


def with_eval_prompt(config, task_kwargs: dict, use_chat_template: bool | None = None):
    """A copy of ``config`` whose evaluation scores the same held-out problems under another prompt:
    env.eval_kwargs updated by ``task_kwargs``, and env.use_chat_template set when ``use_chat_template``
    is not None. ``config`` itself is left as it is."""
    env = dataclasses.replace(
        config.env,
        eval_kwargs={**config.env.eval_kwargs, **task_kwargs},
        use_chat_template=config.env.use_chat_template if use_chat_template is None else use_chat_template,
    )
    return dataclasses.replace(config, env=env)


def zero_shot(config):
    """``config`` evaluated zero-shot (`rlvr eval --zero-shot`): the task's few-shot examples removed
    (env.eval_kwargs.few_shot = []) and the prompt rendered with the chat template (env.use_chat_template =
    true); the prompt template, system prompt, problems and reward stay the config's."""
    return with_eval_prompt(config, ZERO_SHOT_KWARGS, use_chat_template=True)


def transfer_eval_config(config):
    """The config of training's second held-out evaluation (metric eval_accuracy_transfer): env.eval_kwargs
    updated by env.transfer_eval_kwargs, under env.transfer_eval_chat_template; None when neither is set."""
    env = config.env
    if not env.has_transfer_eval():
        return None
    return with_eval_prompt(config, env.transfer_eval_kwargs, env.transfer_eval_chat_template)


# task fields that change what is asked, never how it is scored
PROMPT_ONLY_FIELDS = ("few_shot", "few_shot_keep", "prompt_variants", "prompt_variant_chance")


def asks_the_same(config, eval_set, other_config, other_set) -> bool:
    """Whether two evaluations pose the same questions the same way and score them alike: the same chat-template
    setting, problems and rendered messages, and task configs equal apart from their examples (whose effect the
    messages show). One greedy evaluation then gives both scores, e.g. a transfer evaluation of the examples
    removed (env.transfer_eval_kwargs {few_shot: []}) from a prompt that shows none (few_shot_keep 0)."""
    (task, indices), (other_task, other_indices) = eval_set, other_set
    if config.env.use_chat_template != other_config.env.use_chat_template or indices != other_indices:
        return False
    configs = [{k: v for k, v in dataclasses.asdict(t.config).items() if k not in PROMPT_ONLY_FIELDS}
               for t in (task, other_task)]
    if configs[0] != configs[1]:
        return False
    seed = config.env.eval_seed
    for i in procedural_eval_indices(config) if indices is None else indices:
        problem, other_problem = task.problem(i, seed), other_task.problem(i, seed)
        if problem != other_problem or task.messages(problem) != other_task.messages(other_problem):
            return False
    return True


def warn_if_eval_reads_training_data(config, task) -> None:
    """Training on a dataset task without env.eval_kwargs evaluates on problems it trains on: say so."""
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

    return draw_problem_indices(seeding.np_random(config.env.eval_seed)[0], None, config.env.eval_size)


@torch.no_grad()
def greedy_rollouts(model, tokenizer, config, backend, device: torch.device, task, indices):
    """Greedy rollouts of ``task``'s held-out problems ``indices`` (seed env.eval_seed), env.eval_batch_size rows
    at a time: one RolloutResult per batch, the model in eval mode meanwhile."""
    batch = config.env.eval_batch_size or len(indices)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(indices), batch):
            chunk = indices[start : start + batch]
            env = make_env(config, tokenizer, num_envs=len(chunk), device=device, problem_seed=config.env.eval_seed,
                           task=task, model=model)
            env.reset(seed=config.env.eval_seed, options={"group_size": 1, "problem_indices": chunk})
            yield backend.generate(model, env, greedy=True)
    finally:
        model.train(was_training)


def evaluate(model, tokenizer, config, backend, device: torch.device, eval_set=None) -> float:
    """Greedy accuracy on the held-out problems of ``eval_set`` (default: ``eval_task(config)``, built now),
    generated env.eval_batch_size rows at a time. Under torchrun each rank generates its share of the problems
    (``model`` whole on every rank: algos.system.distributed.whole_weights) and the counts are summed."""
    task, every_index = eval_set or eval_task(config)
    every_index = procedural_eval_indices(config) if every_index is None else every_index
    world = current_world()
    indices = every_index[world.rank * len(every_index) // world.size : (world.rank + 1) * len(every_index) // world.size]
    solved = [torch.zeros(0, device=device)]
    solved += [result.solved.float() for result in greedy_rollouts(model, tokenizer, config, backend, device, task, indices)]
    right, total = sum_over_ranks(torch.cat(solved).sum().item(), len(indices))
    return right / total


def evaluate_saved_model(config, path, eval_set=None) -> float:
    """Greedy held-out accuracy of a saved model directory, in the dtype and precision of config.model;
    ``eval_set`` as in ``evaluate``. The config is resolved as a training run's is (resolve_run_config, with
    model.path = ``path``): precision measured on that model's shapes, rollout.backend "auto" as training picks it;
    ``config`` itself is left as it is."""
    world = init_distributed(config.distributed, config.model.device)
    saved = dataclasses.replace(config, model=dataclasses.replace(config.model, path=str(path)))
    run = resolve_run_config(saved, world)
    model, tokenizer = load_policy(run.config.model.path, dtype=DTYPES[run.config.model.dtype], device=run.device)
    with mixed_precision(run.config.model, run.device):
        return evaluate(model, tokenizer, run.config, make_rollout_backend(run.config), device=run.device,
                        eval_set=eval_set)
