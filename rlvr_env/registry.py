"""Task registry, mirrored into Gymnasium's own registry as ``rlvr/<Name>-v<N>``."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import gymnasium

from rlvr_env.task import Task

NAMESPACE = "rlvr"
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.]*")
_ENV_ID = re.compile(rf"(?:{NAMESPACE}/)?(?P<name>[A-Za-z][A-Za-z0-9_.]*?)(?:-v(?P<version>\d+))?")
REASONING_GYM_PREFIX = "rg."

# env id -> (task class, default task kwargs)
_TASKS: dict[str, tuple[type[Task], dict[str, Any]]] = {}


def register_task(name: str, task_cls: type[Task], version: int = 0, **default_kwargs: Any) -> str:
    """Register ``task_cls`` as ``rlvr/<name>-v<version>``; returns the id.

    ``gymnasium.make(id, **kwargs)`` then builds a CompletionEnv; ``kwargs`` are task
    config fields (over ``default_kwargs``) plus CompletionEnv's own arguments.
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"task name {name!r} must be letters, digits, '_' or '.', starting with a letter (no ':', '/', '-')")
    if not (isinstance(task_cls, type) and issubclass(task_cls, Task)):
        raise ValueError(f"task_cls must be a subclass of rlvr_env.Task, got {task_cls!r}")
    if not isinstance(version, int) or version < 0:
        raise ValueError(f"version must be a non-negative integer, got {version!r}")
    fields = {f.name for f in dataclasses.fields(task_cls.config_cls)}
    unknown = sorted(set(default_kwargs) - fields)
    if unknown:
        raise ValueError(f"{task_cls.config_cls.__name__} has no field {unknown[0]!r}")
    env_id = f"{NAMESPACE}/{name}-v{version}"
    _TASKS[env_id] = (task_cls, dict(default_kwargs))
    gymnasium.register(id=env_id, entry_point="rlvr_env.completion_env:make_completion_env", kwargs={"task_id": env_id})
    return env_id


def registered_tasks() -> dict[str, tuple[type[Task], dict[str, Any]]]:
    """A copy of the registry: env id -> (task class, default kwargs)."""
    return dict(_TASKS)


def resolve_id(env_id_or_name: str) -> str:
    """``"rlvr/Arithmetic-v0"``, ``"Arithmetic-v0"`` or ``"Arithmetic"`` (latest version) -> the env id."""
    match = _ENV_ID.fullmatch(env_id_or_name)
    if match and match["name"].startswith(REASONING_GYM_PREFIX):
        register_reasoning_gym()
    if match:
        name, version = match["name"], match["version"]
        if version is not None:
            candidate = f"{NAMESPACE}/{name}-v{version}"
            if candidate in _TASKS:
                return candidate
        else:
            versions = [i for i in _TASKS if i.rsplit("-v", 1)[0] == f"{NAMESPACE}/{name}"]
            if versions:
                return max(versions, key=lambda i: int(i.rsplit("-v", 1)[1]))
    known = ", ".join(sorted(i for i in _TASKS if not i.startswith(f"{NAMESPACE}/{REASONING_GYM_PREFIX}")))
    raise ValueError(f"no task registered as {env_id_or_name!r}; registered: {known}")


def make_task(env_id_or_name: str, **kwargs: Any) -> Task:
    """A fresh task: the registered defaults overridden by ``kwargs`` (config fields)."""
    task_cls, defaults = _TASKS[resolve_id(env_id_or_name)]
    return task_cls(**{**defaults, **kwargs})


def register_reasoning_gym() -> list[str]:
    """Register every installed reasoning-gym dataset as ``rlvr/rg.<name>-v0`` (once);
    returns the ids, empty when reasoning-gym is not installed. Not done on import:
    importing reasoning-gym takes about a second."""
    from rlvr_env.tasks.reasoning_gym_adapter import ReasoningGymTask, reasoning_gym_names

    ids = []
    for name in reasoning_gym_names():
        env_id = f"{NAMESPACE}/{REASONING_GYM_PREFIX}{name}-v0"
        ids.append(env_id if env_id in _TASKS else register_task(REASONING_GYM_PREFIX + name, ReasoningGymTask, dataset=name))
    return ids
