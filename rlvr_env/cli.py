"""The `rlvr` command: one entry point, one subcommand module per package.

Each package contributes its subcommands through ``register(subparsers)``; the
modules are imported lazily so `rlvr verify` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module that provides register(subparsers) and owns it
SUBCOMMAND_MODULES = {
    "verify": "rewards.cli",
    "score": "rewards.cli",
    "envs": "rlvr_env.env_cli",
    "train": "algos.cli",
    "eval": "algos.cli",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlvr", description="RL with verifiable rewards for language models.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = [SUBCOMMAND_MODULES[only]] if only else list(dict.fromkeys(SUBCOMMAND_MODULES.values()))
    for name in modules:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in SUBCOMMAND_MODULES else None
    if command is None and argv and not argv[0].startswith("-"):
        print(f"rlvr: unknown command {argv[0]!r}; choose from {', '.join(SUBCOMMAND_MODULES)}", file=sys.stderr)
        return 2
    if command is None:
        # `rlvr` or `rlvr --help`: list every command without importing the heavy modules.
        parser = argparse.ArgumentParser(prog="rlvr", description="RL with verifiable rewards for language models.")
        parser.add_argument("command", choices=list(SUBCOMMAND_MODULES))
        parser.parse_args(argv)
        return 2
    args = build_parser(only=command).parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
