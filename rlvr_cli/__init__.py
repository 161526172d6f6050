"""The `rlvr` command: one entry point; each package owns its subcommands.

A package contributes its subcommands through ``register(subparsers)`` in its own ``cli``
module. Only the package that owns the command being run is imported, so `rlvr verify`
never imports torch.
"""

from __future__ import annotations

import argparse
import logging
import sys

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
}


def build_parser(command: str) -> argparse.ArgumentParser:
    """The parser for ``command``: the commands of the package that owns it, that package imported."""
    parser = argparse.ArgumentParser(prog="rlvr", description=DESCRIPTION)
    REGISTRARS[command](parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in REGISTRARS else None
    if command is None and argv and not argv[0].startswith("-"):
        print(f"rlvr: unknown command {argv[0]!r}; choose from {', '.join(REGISTRARS)}", file=sys.stderr)
        return 2
    if command is None:
        # `rlvr` or `rlvr --help`: list every command without importing the heavy modules.
        parser = argparse.ArgumentParser(prog="rlvr", description=DESCRIPTION)
        parser.add_argument("command", choices=list(REGISTRARS))
        parser.parse_args(argv)
        return 2
    args = build_parser(command).parse_args(argv)
    # The library logs to the "rlvr" logger (e.g. the machine and the precision a run chose); the CLI shows it.
    logging.basicConfig(level=logging.INFO, format="rlvr: %(message)s", stream=sys.stderr)
    return int(args.func(args) or 0)
