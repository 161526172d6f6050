"""Task registry, mirrored into Gymnasium's own registry as ``rlvr/<Name>-v<N>``."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.metadata
import re
from typing import Any

import gymnasium

from rlvr_env.task import Task

NAMESPACE = "rlvr"
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.]*")
_ENV_ID = re.compile(rf"(?:{NAMESPACE}/)?(?P<name>[A-Za-z][A-Za-z0-9_.]*?)(?:-v(?P<version>\d+))?", re.IGNORECASE)
REASONING_GYM_PREFIX = "rg."
# Installed packages declare their tasks here (pyproject: [project.entry-points."rlvr_env.tasks"] squares =
# "my_package.tasks"): each entry names a module that registers tasks on import, or a function that does.
ENTRY_POINT_GROUP = "rlvr_env.tasks"
_entry_points_loaded = False

# env id -> (task class, default task kwargs)
_TASKS: dict[str, tuple[type[Task], dict[str, Any]]] = {}


def register_task(name: str, task_cls: type[Task], version: int = 0, **default_kwargs: Any) -> str:
    """Register ``task_cls`` as ``rlvr/<name>-v<version>``; returns the id.

    ``gymnasium.make(id, **kwargs)`` then builds a CompletionEnv (a MultiTurnEnv for a task class that
    names its own ``env_entry_point``); ``kwargs`` are task config fields (over ``default_kwargs``) plus
    the env's own arguments.
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
    entry_point = getattr(task_cls, "env_entry_point", "rlvr_env.completion_env:make_completion_env")
    gymnasium.register(id=env_id, entry_point=entry_point, kwargs={"task_id": env_id})
    return env_id


def registered_tasks() -> dict[str, tuple[type[Task], dict[str, Any]]]:
    """A copy of the registry: env id -> (task class, default kwargs)."""
    return dict(_TASKS)


def _name_of(env_id: str) -> str:
    """``"rlvr/Arithmetic-v0"`` -> ``"Arithmetic"``."""
    return env_id[len(NAMESPACE) + 1 :].rsplit("-v", 1)[0]


def _ids_named(name: str) -> list[str]:
    """The registered ids of task ``name``; matched case-insensitively when no name matches exactly
    and the case-folded match is unique (``Foo`` and ``foo`` may both be registered)."""
    ids = [i for i in _TASKS if _name_of(i) == name]
    if not ids:
        ids = [i for i in _TASKS if _name_of(i).lower() == name.lower()]
        if len({_name_of(i) for i in ids}) > 1:
            return []
    return ids


def import_task_module(module: str) -> None:
    """Import ``module`` for the tasks it registers (the part before ``:`` of ``"my_package.tasks:Squares-v0"``,
    Gymnasium's convention); ValueError naming it when it cannot be imported."""
    try:
        importlib.import_module(module)
    except ImportError as error:
        raise ValueError(f"env id {module}:...: cannot import module {module!r} ({error}); the part before ':' is "
                         "the module that registers the task, importable from here (installed, or on PYTHONPATH)") from error


def load_entry_point_tasks() -> bool:
    """Register the tasks installed packages declare in the ``rlvr_env.tasks`` entry-point group (once); whether
    this call loaded any."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return False
    _entry_points_loaded = True
    entries = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    for entry in entries:
        try:
            loaded = entry.load()
        except Exception as error:
            raise ValueError(f"entry point {entry.name} = {entry.value} ({ENTRY_POINT_GROUP}): {error}") from error
        if callable(loaded):
            loaded()
    return bool(entries)


def spelled_id(env_id_or_name: str) -> str:
    """The one spelling a run records: the registered id, after the module that registers it when one was named
    (``"my_package.tasks:rlvr/Squares-v0"``), so a resume or an eval in a fresh process finds it again."""
    module, sep, _ = env_id_or_name.rpartition(":")
    return f"{module}{sep}{resolve_id(env_id_or_name)}"


def resolve_id(env_id_or_name: str) -> str:
    """``"rlvr/Arithmetic-v0"``, ``"Arithmetic-v0"`` or ``"Arithmetic"`` (latest version) -> the env id;
    ``"my_package.tasks:Squares-v0"`` imports ``my_package.tasks`` first, and an id no task has looks in the
    ``rlvr_env.tasks`` entry points before it fails. Names match case-insensitively (``"rlvr/arithmetic-v0"``);
    an unknown id's error suggests close ones and says how to name a task of one's own."""
    module, sep, env_id_or_name = env_id_or_name.rpartition(":")
    if sep:
        import_task_module(module)
    found = _registered_id(env_id_or_name)
    if found is None and load_entry_point_tasks():
        found = _registered_id(env_id_or_name)
    if found is not None:
        return found
    by_name: dict[str, list[str]] = {}  # lower-cased name -> its ids, for suggestions
    for env_id in sorted(_TASKS):
        by_name.setdefault(_name_of(env_id).lower(), []).append(env_id)
    match = _ENV_ID.fullmatch(env_id_or_name)
    query = (match["name"] if match else env_id_or_name).lower()
    close = [i for name in difflib.get_close_matches(query, by_name, n=3) for i in by_name[name]]
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    known = ", ".join(sorted(i for i in _TASKS if not i.startswith(f"{NAMESPACE}/{REASONING_GYM_PREFIX}")))
    own = (f"a task of your own: name the module that registers it, e.g. my_package.tasks:{env_id_or_name}, or "
           f"declare it in the {ENTRY_POINT_GROUP!r} entry-point group")
    raise ValueError(f"no task registered as {env_id_or_name!r}; {hint}registered: {known}; {own}")


def _registered_id(env_id_or_name: str) -> str | None:
    """The registered id ``env_id_or_name`` names (latest version when it gives none), or None."""
    match = _ENV_ID.fullmatch(env_id_or_name)
    if match and match["name"].lower().startswith(REASONING_GYM_PREFIX):
        register_reasoning_gym()
    if not match:
        return None
    ids = _ids_named(match["name"])
    if match["version"] is not None:
        ids = [i for i in ids if int(i.rsplit("-v", 1)[1]) == int(match["version"])]
    return max(ids, key=lambda i: int(i.rsplit("-v", 1)[1])) if ids else None


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
