"""The `rlvr` command: one entry point; each package owns its subcommands.

A package contributes its subcommands through ``register(subparsers)`` in its own ``cli``
module. Only the package that owns the command being run is imported, so `rlvr verify`
never imports torch.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import sys
import warnings

DESCRIPTION = "RL with verifiable rewards for language models."


# One function per package: the import inside it is what makes the dispatch lazy.
def _register_rewards(subparsers) -> None:
    from rewards import cli

    cli.register(subparsers)


def _register_envs(subparsers) -> None:
    from rlvr_env import cli

    cli.register(subparsers)


def _register_algos(subparsers) -> None:
    from algos import cli

    cli.register(subparsers)


# subcommand -> the function that registers it (with its package's other subcommands)
REGISTRARS = {
    "verify": _register_rewards,
    "score": _register_rewards,
    "envs": _register_envs,
    "train": _register_algos,
    "eval": _register_algos,
    "export": _register_algos,
}

# subcommand -> its one-line help as its package registers it, kept here so that `rlvr --help` imports no
# package (tests/test_cli.py checks the two agree)
COMMAND_HELP = {
    "verify": "check one predicted answer or response against a gold answer",
    "score": "score a JSONL file of completions against gold answers",
    "envs": "list registered environments and their task kwargs",
    "train": "train a policy with GRPO, DAPO, RLOO, CISPO, GMPO, PPO, REINFORCE++, DPO or online DPO",
    "eval": "greedy accuracy of a model on held-out problems of an env (--samples N: pass@k and maj@N)",
    "export": "write a run's model as a transformers directory (--merge: a LoRA adapter merged into its base)",
}

# What a shell reports for a program killed by SIGPIPE (128 + 13), as `yes | head -1` does for `yes`.
BROKEN_PIPE_EXIT = 141


def build_parser(command: str) -> argparse.ArgumentParser:
    """The parser for ``command``: the commands of the package that owns it, that package imported."""
    parser = argparse.ArgumentParser(prog="rlvr", description=DESCRIPTION)
    REGISTRARS[command](parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return parser


def _version() -> str:
    """The installed rlvr-env's version (a checkout run without installing: "unknown")."""
    try:
        return importlib.metadata.version("rlvr-env")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _command_listing() -> argparse.ArgumentParser:
    """`rlvr` alone or `rlvr --help`: every command with its one-line help, no package imported."""
    parser = argparse.ArgumentParser(prog="rlvr", description=DESCRIPTION, epilog="rlvr COMMAND --help shows its options.")
    parser.add_argument("--version", action="version", version=f"rlvr {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command, text in COMMAND_HELP.items():
        commands.add_parser(command, help=text)
    return parser


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A warning as one line, as the CLI's other messages (Python's default adds the file, line and source). A
    formatter, not a showwarning: code that records warnings (warnings.catch_warnings) still gets them."""
    return f"rlvr: {category.__name__}: {message}\n"


def _run(argv: list[str]) -> int:
    command = argv[0] if argv and argv[0] in REGISTRARS else None
    if command is None and argv and not argv[0].startswith("-"):
        print(f"rlvr: unknown command {argv[0]!r}; choose from {', '.join(REGISTRARS)}", file=sys.stderr)
        return 2
    if command is None:
        _command_listing().parse_args(argv)  # prints the help and exits, or an argparse error (exit 2)
        return 2
    args = build_parser(command).parse_args(argv)
    # The library logs to the "rlvr" logger (e.g. the machine and the precision a run chose); the CLI shows it.
    logging.basicConfig(level=logging.INFO, format="rlvr: %(message)s", stream=sys.stderr)
    warnings.formatwarning = _one_line_warning
    return int(args.func(args) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()  # a reader that left (`rlvr envs | head -2`) shows up here, not at interpreter exit
    except BrokenPipeError:
        # Python's recipe (docs of `signal`, "Note on SIGPIPE"): stdout to devnull, so the flush at exit does not fail too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE_EXIT
