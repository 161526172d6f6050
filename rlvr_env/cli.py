"""`rlvr envs`: list the registered environment ids with their task config fields."""

from __future__ import annotations

import dataclasses
import json


def register(subparsers) -> None:
    parser = subparsers.add_parser("envs", help="list registered environments and their task kwargs")
    parser.add_argument("--json", action="store_true", help="one JSON object per id instead of a table")
    parser.add_argument(
        "--reasoning-gym", action="store_true", help="also register and list reasoning-gym datasets (rlvr/rg.<name>-v0)"
    )
    parser.set_defaults(func=list_envs)


def task_kwargs(task_cls, defaults: dict) -> dict:
    """Every config field of the task with the value an env gets unless told otherwise."""
    values = {}
    for f in dataclasses.fields(task_cls.config_cls):
        if f.name in defaults:
            values[f.name] = defaults[f.name]
        elif f.default is not dataclasses.MISSING:
            values[f.name] = f.default
        else:
            values[f.name] = f.default_factory()
    return values


def list_envs(args) -> int:
    import rlvr_env

    if args.reasoning_gym:
        rlvr_env.register_reasoning_gym()
    for env_id, (task_cls, defaults) in sorted(rlvr_env.registered_tasks().items()):
        kwargs = task_kwargs(task_cls, defaults)
        if args.json:
            print(json.dumps({"id": env_id, "task": task_cls.__name__, "kwargs": kwargs}, default=repr))
        else:
            shown = ", ".join(f"{name}={value!r}" for name, value in kwargs.items())
            print(f"{env_id}  ({task_cls.__name__})  {shown}")
    return 0
