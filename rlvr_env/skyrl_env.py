"""A SkyRL-gym environment over rlvr_env's tasks: one turn, the response scored by the task's verifier.

Register it in SkyRL's training entrypoint, one id per task, and train on rows that
`skyrl_dataset_rows` writes in SkyRL's dataset format (prompt, env_class, reward_spec):

    from skyrl_gym.envs import register
    register(id="rlvr_arithmetic", entry_point="rlvr_env.skyrl_env:RlvrTaskEnv", kwargs={"task": "Arithmetic"})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from rewards.adapters import is_blank_gold
from rewards.batch import score_batch
from rlvr_env import Task, make_task

_TASKS: dict[tuple[str, str], Task] = {}


def _shared_task(name: str, config: dict[str, Any]) -> Task:
    # SkyRL builds one env per trajectory: build each task (a dataset task reads its file) once per process
    key = (name, repr(sorted(config.items())))
    if key not in _TASKS:
        _TASKS[key] = make_task(name, **config)
    return _TASKS[key]


class RlvrTaskEnv(BaseTextEnv):
    """``step(response)`` scores the response with the task's verifier against the row's
    ``reward_spec["ground_truth"]`` and ends the episode; ``get_metrics()`` then gives the verifier's
    components and ``solved``.

    SkyRL builds it as ``skyrl_gym.make(env_class, env_config=..., extras=row)``, where ``row`` is the
    dataset row less its prompt and env_class; ``task`` and the task's config fields come from the
    registration's kwargs. A row without a ground truth raises ValueError naming the field."""

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None, *, task: str,
                 **task_config: Any):
        super().__init__()
        reward_spec = (extras or {}).get("reward_spec")
        self.ground_truth = reward_spec.get("ground_truth") if isinstance(reward_spec, Mapping) else None
        if is_blank_gold(self.ground_truth):
            raise ValueError(f"RlvrTaskEnv({task!r}): the row's reward_spec.ground_truth is {self.ground_truth!r}; "
                             "each row needs reward_spec={'ground_truth': answer} (skyrl_dataset_rows writes it)")
        self.task = _shared_task(task, task_config)
        self.metrics: dict[str, float] = {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        [result] = score_batch([action], [self.ground_truth], verifier=self.task.verifier)
        self.metrics = {**result.details.get("components", {}), "solved": float(self.task.is_success(result))}
        return BaseTextEnvStepOutput(observations=[], reward=float(result.score), done=True,
                                     metadata={"verifier_status": result.status, "answer": self.ground_truth})

    def get_metrics(self) -> dict[str, float]:
        return self.metrics


def skyrl_dataset_rows(task: str, count: int, *, env_class: str, seed: int = 0, **task_config: Any) -> list[dict]:
    """Problems 0..count-1 of ``task`` as SkyRL dataset rows (``pandas.DataFrame(rows).to_parquet(path)``):
    the chat prompt, ``env_class`` (the id RlvrTaskEnv is registered under), ``reward_spec`` with the
    gold answer, and ``extra_info``."""
    source = make_task(task, **task_config)
    rows = []
    for index in range(count):
        problem = source.problem(index, seed)
        rows.append({
            "prompt": source.messages(problem),
            "env_class": env_class,
            "reward_spec": {"method": "rule", "ground_truth": problem.answer},
            "extra_info": {"task": task, "problem_index": index, "seed": seed},
        })
    return rows
