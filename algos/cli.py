"""`rlvr train` and `rlvr eval`.

    rlvr train --algo grpo|dapo|rloo|cispo|gmpo|ppo|reinforce_pp[_baseline]|dpo|online_dpo \
        --env rlvr/Arithmetic-v0 --model PATH|default [--dataset prefs.jsonl] [--config run.toml] [--resume] \
        [--section.key value | --key value ...]
    rlvr eval --env rlvr/Arithmetic-v0 --model PATH|default [--num-problems N] [--zero-shot] [overrides]

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
from functools import partial
from typing import Any

from rewards.cli import int_at_least

# name -> (module, preset in that module's PRESETS or None). Add an algorithm by adding a line.
ALGORITHMS: dict[str, tuple[str, str | None]] = {
    "grpo": ("algos.algorithms.grpo", None),
    "dapo": ("algos.algorithms.grpo", "dapo"),
    "rloo": ("algos.algorithms.grpo", "rloo"),
    "cispo": ("algos.algorithms.grpo", "cispo"),
    "gmpo": ("algos.algorithms.grpo", "gmpo"),
    "ppo": ("algos.algorithms.ppo", None),
    "reinforce_pp": ("algos.algorithms.ppo", "reinforce_pp"),
    "reinforce_pp_baseline": ("algos.algorithms.ppo", "reinforce_pp_baseline"),
    "dpo": ("algos.algorithms.dpo", None),
    "online_dpo": ("algos.algorithms.dpo", "online"),
}


class _OverridesParser(argparse.ArgumentParser):
    """Keeps unrecognised `--key value` pairs as config overrides instead of rejecting them;
    algos.config then rejects unknown keys with the key's name."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        namespace.overrides = extras
        return namespace, []


class _HelpWithConfigKeys(argparse.Action):
    """-h/--help that also lists every config key with its default: ``describe(namespace)`` builds that list only
    when help is asked for, as it imports the algorithms' modules (and torch)."""

    def __init__(self, option_strings, dest, describe):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0,
                         help="show this help and every config key with its default, then exit")
        self.describe = describe

    def __call__(self, parser, namespace, values, option_string=None):
        parser.epilog = self.describe(namespace)
        parser.print_help()
        parser.exit()


def _add_parser(subparsers, name: str, describe_keys, **kwargs) -> argparse.ArgumentParser:
    # raw: the key listing keeps its lines and columns
    parser = subparsers.add_parser(name, allow_abbrev=False, add_help=False,
                                   formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
    parser.__class__ = _OverridesParser  # the dispatcher builds subparsers; only their parsing changes
    parser.add_argument("-h", "--help", action=_HelpWithConfigKeys, describe=describe_keys)
    return parser


def _algorithm(name: str) -> tuple[Any, dict[str, Any] | None]:
    """The module of algorithm ``name`` and the preset of config values it applies (None: its Config's defaults)."""
    module_name, preset = ALGORITHMS[name]
    module = importlib.import_module(module_name)
    return module, getattr(module, "PRESETS", {}).get(preset)


KEYS_USAGE = "Config keys: --section.key value, or --key value where one section has the key ('null' for none)."


def _other_algorithms_sections(config_cls: type) -> set[str]:
    """Sections other algorithms' configs have and ``config_cls`` does not (``ppo`` for GRPO): one config file may
    hold them all, and each algorithm sets the others' aside."""
    every = {f.name for module, _ in ALGORITHMS.values() for f in dataclasses.fields(importlib.import_module(module).Config)}
    return every - {f.name for f in dataclasses.fields(config_cls)}


def _train_keys(namespace) -> str:
    from algos.config import TrainConfig, describe_sections, from_dict

    if namespace.algo:  # None when --help comes before --algo
        module, preset = _algorithm(namespace.algo)
        aside = ", ".join(sorted(_other_algorithms_sections(module.Config)))
        return (f"{KEYS_USAGE}\nDefaults of --algo {namespace.algo} (a --config file's sections of other algorithms, "
                f"{aside}, are set aside):\n" + describe_sections(from_dict(module.Config, preset or {})))
    algorithm_configs = [importlib.import_module(name).Config() for name in dict.fromkeys(m for m, _ in ALGORITHMS.values())]
    return (f"{KEYS_USAGE}\nDefaults (an algorithm may change some: rlvr train --algo NAME --help shows its own):\n"
            + describe_sections(TrainConfig(), *algorithm_configs))


# What rlvr eval does not read: it decodes greedily, its problems once each.
EVAL_IGNORES = ("rollout.temperature", "rollout.top_p", "rollout.top_k", "rollout.prompts_per_step", "rollout.group_size")


def _eval_keys(namespace) -> str:
    import algos.rollout  # noqa: F401 - registers the engines, whose sections are listed
    from algos.config import EvalConfig, describe_sections

    return (f"{KEYS_USAGE}\nDefaults (decoding is greedy: {', '.join(EVAL_IGNORES)} do not apply):\n"
            + describe_sections(EvalConfig(), leave_out=EVAL_IGNORES))


def register(subparsers) -> None:
    train = _add_parser(
        subparsers,
        "train",
        _train_keys,
        help="train a policy with GRPO, DAPO, RLOO, CISPO, GMPO, PPO, REINFORCE++, DPO or online DPO",
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
        _eval_keys,
        help="greedy accuracy of a model on held-out problems of an env (--samples N: pass@k and maj@N)",
        description="Greedy accuracy on env.eval_size held-out problems (seed env.eval_seed); with --samples N, N "
                    "completions a problem sampled at rollout.temperature (top_p, top_k) instead: the unbiased pass@k "
                    "for k = 1, 2, 4, ..., N (pass@1: the share of samples solved) and maj@N (the majority answer's).",
    )
    evaluate.add_argument("--env", help="task id (config env.id)")
    evaluate.add_argument("--model", help="local transformers directory or 'default' (config model.path)")
    evaluate.add_argument("--config", help="TOML or YAML file with config sections")
    evaluate.add_argument("--num-problems", type=int_at_least(1), help="held-out problems (config env.eval_size)")
    evaluate.add_argument("--output", metavar="FILE.jsonl", default=None,
                          help="write what the model wrote, a JSON record a row: problem (its position), sample, prompt, "
                               "completion, answer, score, status, components, truncated")
    evaluate.add_argument("--samples", type=int_at_least(1), default=0, metavar="N",
                          help="sample N completions a problem (rollout.temperature, each row from its own seed) and "
                               "report pass@k and maj@N instead of greedy accuracy")
    evaluate.add_argument(
        "--zero-shot", action="store_true",
        help="score the same held-out problems zero-shot: the task's few-shot examples removed (env.eval_kwargs.few_shot "
             "= []) and the prompt rendered with the chat template (env.use_chat_template = true); the prompt template, "
             "system prompt and reward stay the config's. E.g. a few-shot-trained run asked the bare question: "
             "rlvr eval --config runs/x/config.yaml --model runs/x --zero-shot",
    )
    evaluate.set_defaults(func=_eval)

    export = subparsers.add_parser(
        "export", allow_abbrev=False,
        help="write a run's model as a transformers directory (--merge: a LoRA adapter merged into its base)",
        description="Write the model of a run directory, a checkpoint or a model directory to OUT. A LoRA run's "
                    "checkpoints hold the adapter in PEFT's format; --merge writes its base model with W + scale * B @ A "
                    "merged in, a plain transformers directory any tool loads.",
    )
    export.add_argument("source", help="run directory (its latest checkpoint), checkpoint-N, or a model directory")
    export.add_argument("out", help="directory to write (must not exist)")
    export.add_argument("--merge", action="store_true",
                        help="merge a LoRA adapter into its base model (without it, the model directory is copied as is)")
    export.set_defaults(func=_export)


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


def _quiet_libraries() -> None:
    """No transformers progress bars ("Loading weights", "Writing model shards") in a command's output: the run's own
    bar or step lines say where it stands."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def _train(args) -> int:
    from algos.system.distributed import current_world, leave

    _quiet_libraries()
    try:
        module, preset = _algorithm(args.algo)
    except ModuleNotFoundError as err:
        module_name = ALGORITHMS[args.algo][0]
        if err.name == module_name:
            return _fail(f"algorithm {args.algo!r} is not available: module {module_name} is missing")
        raise
    try:
        # one config file serves every --algo: the sections of the others are set aside
        config = _load(module.Config, args, {"env.id": args.env, "model.path": args.model}, preset=preset,
                       unused_sections=_other_algorithms_sections(module.Config))
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
    from pathlib import Path

    from algos.config import EvalConfig
    from algos.system.distributed import current_world, launched_world, leave

    _quiet_libraries()
    # A training run's config.yaml works as is: its training-only sections (optim, grpo, ppo) are set aside.
    training_sections = {
        f.name for module, _ in ALGORITHMS.values() for f in dataclasses.fields(importlib.import_module(module).Config)
    } - {f.name for f in dataclasses.fields(EvalConfig)}
    extra = {"env.id": args.env, "model.path": args.model, "env.eval_size": args.num_problems}
    from algos.model.loading import resolve_model_path
    from algos.run.evaluation import eval_task, evaluate, evaluate_sampled, evaluate_saved_model, zero_shot

    try:
        config = _load(EvalConfig, args, extra, unused_sections=training_sections)
        if args.zero_shot:
            config = zero_shot(config)
        eval_set = eval_task(config)  # built once: it reads a dataset's file
        # what "default", a checkpoint or a run directory names now (a run's latest checkpoint's model/), resolved once
        model_dir = str(resolve_model_path(config.model.path))
        score = partial(evaluate_sampled, samples=args.samples) if args.samples else evaluate
        records = None if args.output is None else []
        if args.output is not None and launched_world().rank == 0:  # before the process group: torchrun's rank
            try:  # a path that cannot be written fails now, not after the evaluation
                Path(args.output).write_text("")
            except OSError as error:
                raise ValueError(f"--output {args.output}: cannot write it ({error.strerror or error})") from None
        scores = evaluate_saved_model(config, model_dir, eval_set, score, records)
    except (*USER_ERRORS, KeyboardInterrupt) as err:
        return _report(err)
    finally:
        main = current_world().is_main
        leave()
    if not main:
        return 0
    indices = eval_set[1]
    problems = config.env.eval_size if indices is None else len(indices)
    sampling = {"samples": args.samples, "temperature": config.rollout.temperature, **scores} if args.samples else {
        "accuracy": scores}
    if records is not None:
        Path(args.output).write_text("".join(json.dumps(record, default=str) + "\n" for record in records))
    print(json.dumps({"env": config.env.id, "model": config.model.path, "model_dir": model_dir, "problems": problems,
                      "prompt": "zero-shot" if args.zero_shot else "config", **sampling}))
    return 0


def _export(args) -> int:
    import shutil
    from pathlib import Path

    from algos.model.loading import load_policy, resolve_model_path

    _quiet_libraries()
    out = Path(args.out)
    try:
        if out.exists():
            raise ValueError(f"export: {out} already exists; name a new directory")
        source = resolve_model_path(args.source)
        if args.merge:
            model, tokenizer = load_policy(source, device="cpu")  # a PEFT adapter directory loads merged
            model.save_pretrained(out, safe_serialization=True)
            tokenizer.save_pretrained(out)
        else:
            shutil.copytree(source, out)
    except (*USER_ERRORS, KeyboardInterrupt) as err:
        return _report(err)
    print(json.dumps({"source": str(source), "out": str(out), "merged": args.merge}))
    return 0

