"""`rlvr train` and `rlvr eval`.

    rlvr train --algo grpo|dapo|ppo --env rlvr/Arithmetic-v0 --model PATH|default \
        [--config run.toml] [--resume] [--section.key value | --key value ...]
    rlvr eval --env rlvr/Arithmetic-v0 --model PATH|default [--num-problems N] [overrides]

Algorithms are looked up lazily in ALGORITHMS: name -> (module, preset). A module exposes
`Config` (a dataclass loadable by algos.config.load_config), `train(config, *, resume)` and
optionally `PRESETS` (name -> nested dict of config values applied before the file).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
from typing import Any

# name -> (module, preset in that module's PRESETS or None). Add an algorithm by adding a line.
ALGORITHMS: dict[str, tuple[str, str | None]] = {
    "grpo": ("algos.grpo", None),
    "dapo": ("algos.grpo", "dapo"),
    "ppo": ("algos.ppo", None),
}


class _OverridesParser(argparse.ArgumentParser):
    """Keeps unrecognised `--key value` pairs as config overrides instead of rejecting them;
    algos.config then rejects unknown keys with the key's name."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        namespace.overrides = extras
        return namespace, []


def _add_parser(subparsers, name: str, **kwargs) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, allow_abbrev=False, **kwargs)
    parser.__class__ = _OverridesParser  # the dispatcher builds subparsers; only their parsing changes
    return parser


def register(subparsers) -> None:
    train = _add_parser(
        subparsers,
        "train",
        help="train a policy with GRPO, DAPO or PPO",
        description="Train a policy. Any config field can be set with --section.key value (or --key value).",
    )
    train.add_argument("--algo", required=True, choices=sorted(ALGORITHMS))
    train.add_argument("--env", help="task id, e.g. rlvr/Arithmetic-v0 (config env.id)")
    train.add_argument("--model", help="local transformers directory or 'default' (config model.path)")
    train.add_argument("--config", help="TOML or YAML file with config sections")
    train.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in run.output_dir")
    train.set_defaults(func=_train)

    evaluate = _add_parser(
        subparsers,
        "eval",
        help="greedy accuracy of a model on held-out problems of an env",
        description="Greedy accuracy on env.eval_size held-out problems (seed env.eval_seed).",
    )
    evaluate.add_argument("--env", help="task id (config env.id)")
    evaluate.add_argument("--model", help="local transformers directory or 'default' (config model.path)")
    evaluate.add_argument("--config", help="TOML or YAML file with config sections")
    evaluate.add_argument("--num-problems", type=int, help="held-out problems (config env.eval_size)")
    evaluate.set_defaults(func=_eval)


def _load(config_cls: type, args, extra: dict[str, Any], **options):
    """config_cls from args.config < args.overrides < the set values of ``extra``; ``options`` go to load_config."""
    from algos.config import load_config, parse_overrides

    overrides = parse_overrides(args.overrides)
    overrides.update({k: str(v) for k, v in extra.items() if v is not None})
    return load_config(config_cls, args.config, overrides, **options)


def _fail(message: str) -> int:
    print(f"rlvr: {message}", file=sys.stderr)
    return 2


# What a wrong config, path, file or model raises: the message names it, and a traceback would only bury it.
# RLVR_TRACEBACK=1 shows the traceback instead (a bug can raise these too).
USER_ERRORS = (ValueError, FileNotFoundError)


def _report(error: BaseException) -> int:
    """One line and the exit code for a user error or Ctrl-C; with RLVR_TRACEBACK=1 the traceback instead."""
    if os.environ.get("RLVR_TRACEBACK", "") not in ("", "0"):
        raise error
    if isinstance(error, KeyboardInterrupt):
        print(f"rlvr: {str(error) or 'interrupted'}", file=sys.stderr)
        return 130  # the shell's code for SIGINT
    return _fail(str(error))


def _train(args) -> int:
    from algos.distributed import current_world, leave

    module_name, preset = ALGORITHMS[args.algo]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name == module_name:
            return _fail(f"algorithm {args.algo!r} is not available: module {module_name} is missing")
        raise
    try:
        config = _load(
            module.Config, args, {"env.id": args.env, "model.path": args.model}, preset=getattr(module, "PRESETS", {}).get(preset)
        )
        summary = module.train(config, resume=args.resume)
    except (*USER_ERRORS, KeyboardInterrupt) as err:
        return _report(err)
    finally:
        main = current_world().is_main  # torchrun: one summary, from rank 0
        leave()
    if main:
        print(json.dumps({k: str(v) if v is not None and not isinstance(v, (int, float)) else v for k, v in summary.items()}))
    return 0


def _eval(args) -> int:
    from algos.config import EvalConfig
    from algos.distributed import current_world, leave

    # A training run's config.yaml works as is: its training-only sections (optim, grpo, ppo) are set aside.
    training_sections = {
        f.name for module, _ in ALGORITHMS.values() for f in dataclasses.fields(importlib.import_module(module).Config)
    } - {f.name for f in dataclasses.fields(EvalConfig)}
    extra = {"env.id": args.env, "model.path": args.model, "env.eval_size": args.num_problems}
    from algos.evaluation import eval_task, evaluate_saved_model
    from algos.models import resolve_model_path

    try:
        config = _load(EvalConfig, args, extra, unused_sections=training_sections)
        eval_set = eval_task(config)  # built once: it reads a dataset's file
        # what "default", a checkpoint or a run directory names now (a run's latest checkpoint's model/), resolved once
        model_dir = str(resolve_model_path(config.model.path))
        accuracy = evaluate_saved_model(config, model_dir, eval_set)
    except (*USER_ERRORS, KeyboardInterrupt) as err:
        return _report(err)
    finally:
        main = current_world().is_main
        leave()
    if not main:
        return 0
    indices = eval_set[1]
    problems = config.env.eval_size if indices is None else len(indices)
    print(json.dumps({"env": config.env.id, "model": config.model.path, "model_dir": model_dir, "problems": problems,
                      "accuracy": accuracy}))
    return 0
