"""`rlvr envs`: list the registered environment ids with what each task is; `--kwargs` (or `--json`) adds
their task config fields."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import shutil
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser("envs", help="list registered environments and their task kwargs")
    parser.add_argument("--json", action="store_true", help="one JSON object per id instead of a table")
    parser.add_argument("--kwargs", action="store_true", help="also each task config field with its default, one a line")
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


def description(task_cls) -> str:
    """A task's first docstring line (its class's, else its module's), without a leading "rlvr/Name-v0: "."""
    doc = inspect.getdoc(task_cls) if task_cls.__doc__ else (sys.modules[task_cls.__module__].__doc__ or "")
    first = (doc or "").strip().splitlines()[0] if (doc or "").strip() else ""
    first = re.sub(r"^rlvr/\S+:\s*", "", first)
    return first[:1].upper() + first[1:]


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 3, 0)] + "..."


def list_envs(args) -> int:
    import rlvr_env

    if args.reasoning_gym:
        rlvr_env.register_reasoning_gym()
    width = max(shutil.get_terminal_size((100, 24)).columns, 60)
    for env_id, (task_cls, defaults) in sorted(rlvr_env.registered_tasks().items()):
        kwargs = task_kwargs(task_cls, defaults)
        if args.json:
            print(json.dumps({"id": env_id, "task": task_cls.__name__, "description": description(task_cls),
                              "kwargs": kwargs}, default=repr))
            continue
        print(_fit(f"{env_id:32} {description(task_cls) or task_cls.__name__}", width))
        if args.kwargs:
            for name, value in kwargs.items():
                print(_fit(f"    {name} = {value!r}", width))
    if not args.json and not args.kwargs:
        print("(rlvr envs --kwargs: each task's config fields and defaults; --json: everything as JSON)")
    return 0
