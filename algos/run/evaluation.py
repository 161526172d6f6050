"""Held-out evaluation on problems training never samples (a procedural task's from env.eval_seed; a dataset's first
env.eval_size, from env.eval_kwargs' file when set): greedy accuracy, or pass@k and maj@N of N samples a problem."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Hashable
from typing import Any

import torch

from algos.core.sampled_accuracy import majority_solved, pass_at_k
from algos.model.loading import load_policy
from algos.rollout import build_task, make_env, make_rollout_backend, row_seeds
from algos.run.reporting import rollout_records
from algos.run.resolve import resolve_run_config
from algos.system.distributed import current_world, gather_objects, init_distributed, sum_over_ranks
from algos.system.runtime import DTYPES, mixed_precision
from rewards import extract_answer
from rewards.mathcheck import answer_key
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
def eval_rollouts(model, tokenizer, config, backend, device: torch.device, task, indices, samples: int = 0,
                  first_position: int = 0):
    """Rollouts of ``task``'s held-out problems ``indices`` (seed env.eval_seed), env.eval_batch_size rows at a time:
    one RolloutResult per batch, the model in eval mode meanwhile. ``samples`` 0: one greedy row a problem; N: N rows
    a problem sampled as config.rollout samples, each row from its own seed, a pure function of its position in the
    whole evaluation (``first_position``: the position of ``indices[0]`` there), so a split across ranks or batches
    draws the same tokens."""
    rows_per_problem = max(samples, 1)
    batch = max(1, (config.env.eval_batch_size or len(indices) * rows_per_problem) // rows_per_problem)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(indices), batch):
            chunk = indices[start : start + batch]
            env = make_env(config, tokenizer, num_envs=len(chunk) * rows_per_problem, device=device,
                           problem_seed=config.env.eval_seed, task=task, model=model)
            env.reset(seed=config.env.eval_seed, options={"group_size": rows_per_problem, "problem_indices": chunk})
            if not samples:
                yield backend.generate(model, env, greedy=True)
                continue
            first_row = (first_position + start) * samples
            yield backend.generate(model, env, seeds=row_seeds(config.env.eval_seed, range(first_row, first_row + env.num_envs)))
    finally:
        model.train(was_training)


def _own_share(config, eval_set) -> tuple:
    """(task, this rank's problem indices, the position of its first one among them all): under torchrun each rank
    evaluates a contiguous share of the problems."""
    task, every_index = eval_set or eval_task(config)
    every_index = procedural_eval_indices(config) if every_index is None else every_index
    world = current_world()
    first = world.rank * len(every_index) // world.size
    return task, every_index[first : (world.rank + 1) * len(every_index) // world.size], first


class EvalRecords:
    """What an evaluation's model wrote, a record a row (rlvr eval --output): reporting.rollout_records' fields but
    ``row`` and ``group``, with ``problem`` (its position among the evaluation's problems) and, sampled, ``sample``."""

    def __init__(self, first_position: int, samples: int = 0) -> None:
        self.rows, self.next_position, self.samples = [], first_position, samples

    def add(self, result) -> None:
        per_problem = max(self.samples, 1)
        for record in rollout_records(result):
            row = record.pop("row")
            del record["group"]
            where = {"problem": self.next_position + row // per_problem}
            if self.samples:
                where["sample"] = row % per_problem
            self.rows.append({**where, **record})
        self.next_position += len(result.completions) // per_problem

    def every_ranks(self) -> list[dict[str, Any]]:
        """Every rank's records in the problems' order (each rank holds a contiguous share); a collective."""
        return [record for part in gather_objects(self.rows) for record in part]


def evaluate(model, tokenizer, config, backend, device: torch.device, eval_set=None,
             records: list[dict[str, Any]] | None = None) -> float:
    """Greedy accuracy on the held-out problems of ``eval_set`` (default: ``eval_task(config)``, built now),
    generated env.eval_batch_size rows at a time. Under torchrun each rank generates its share of the problems
    (``model`` whole on every rank: algos.system.distributed.whole_weights) and the counts are summed. ``records``
    (a list) receives every rank's EvalRecords rows."""
    task, indices, first = _own_share(config, eval_set)
    solved, written = [torch.zeros(0, device=device)], None if records is None else EvalRecords(first)
    for result in eval_rollouts(model, tokenizer, config, backend, device, task, indices):
        solved.append(result.solved.float())
        if written is not None:
            written.add(result)
    right, total = sum_over_ranks(torch.cat(solved).sum().item(), len(indices))
    if written is not None:
        records += written.every_ranks()
    return right / total


def reported_ks(samples: int) -> list[int]:
    """The k of pass@k an evaluation of ``samples`` per problem reports: 1, 2, 4, ... up to ``samples``, and it."""
    ks = [2**i for i in range(samples.bit_length())]  # the powers of two up to samples
    return ks if ks[-1] == samples else [*ks, samples]


def answer_votes(completions: list[str], samples: int) -> torch.Tensor:
    """Long[P, N]: each sample's answer (rewards.extract_answer) as an id within its problem, -1 for none. Answers
    that rewards.mathcheck.answer_key makes alike are one answer ("1/2", "\\frac{1}{2}" and "0.5"; "x+1" and "1+x");
    forms only the symbolic check would equate stay apart."""
    votes = []
    for start in range(0, len(completions), samples):
        seen: dict[Hashable, int] = {}
        for completion in completions[start : start + samples]:
            answer = extract_answer(completion)
            votes.append(-1 if answer is None else seen.setdefault(answer_key(answer), len(seen)))
    return torch.tensor(votes, dtype=torch.long).reshape(-1, samples)


def evaluate_sampled(model, tokenizer, config, backend, device: torch.device, eval_set=None,
                     records: list[dict[str, Any]] | None = None, *, samples: int) -> dict[str, float]:
    """``samples`` completions of each held-out problem, sampled as config.rollout samples (temperature, top_p,
    top_k) -> {"pass@k": the unbiased pass@k for each of reported_ks (pass@1: the share of samples solved),
    "maj@N": the share of problems whose majority answer is solved}, the problems split across ranks and
    ``records`` filled as in ``evaluate``."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    task, indices, first = _own_share(config, eval_set)
    ks = reported_ks(samples)
    sums = torch.zeros(len(ks) + 1, dtype=torch.float64)  # pass@k for each k, then maj@N
    written = None if records is None else EvalRecords(first, samples)
    for result in eval_rollouts(model, tokenizer, config, backend, device, task, indices, samples, first):
        solved = result.solved.reshape(-1, samples).cpu()
        sums[:-1] += torch.stack([pass_at_k(solved, k).sum() for k in ks])
        sums[-1] += majority_solved(answer_votes(result.completions, samples), solved).sum()
        if written is not None:
            written.add(result)
    *totals, problems = sum_over_ranks(*sums.tolist(), len(indices))
    if written is not None:
        records += written.every_ranks()
    names = [f"pass@{k}" for k in ks] + [f"maj@{samples}"]
    return {name: total / problems for name, total in zip(names, totals)}


def evaluate_saved_model(config, path, eval_set=None, score=evaluate, records: list[dict[str, Any]] | None = None):
    """``score`` (greedy ``evaluate``, or ``evaluate_sampled`` with its samples bound) of a saved model directory, in
    the dtype and precision of config.model; ``eval_set`` as in ``evaluate``. The config is resolved as a training
    run's is (resolve_run_config, with model.path = ``path``): precision measured on that model's shapes,
    rollout.backend "auto" as training picks it; ``config`` itself is left as it is. ``records`` as in ``evaluate``."""
    world = init_distributed(config.distributed, config.model.device)
    saved = dataclasses.replace(config, model=dataclasses.replace(config.model, path=str(path)))
    run = resolve_run_config(saved, world)
    model, tokenizer = load_policy(run.config.model.path, dtype=DTYPES[run.config.model.dtype], device=run.device)
    with mixed_precision(run.config.model, run.device):
        return score(model, tokenizer, run.config, make_rollout_backend(run.config), device=run.device,
                     eval_set=eval_set, records=records)
