"""GRPO on the default model (SmolLM2-135M-Instruct, embedded) with a calculator: multi-turn tool use, on CPU or GPU.

    python examples/calculator_arithmetic.py [--steps 20] [--out runs/calculator] [--key value ...]

rlvr/CalculatorArithmetic-v0 asks for products of two 3-digit numbers (exact only through the tool); each episode
is the model's messages, the calculator's outputs between them, up to 3 turns (algos/rollout/multiturn.py). The loss covers
the model's own tokens. The base model never writes the call (docs/agents.md), so RL has no signal until a warm start
(docs/warm_start.md) has imitated solved episodes: the call, the calculator's output, the boxed answer. Prints held-out
greedy accuracy before, after the warm start and after RL, and the path of the curves' PNG
(metrics.jsonl has turns_mean, tool_calls_mean, tool_errors_mean per step). Extra ``--section.key value``
arguments override the config below, e.g. ``--env.kwargs '{"digits": 6}'`` or ``--rollout.max_episode_tokens 512``.
"""

from __future__ import annotations

import argparse
import json
import sys

from algos.algorithms import grpo
from algos.config import load_config, parse_overrides

# Small enough for a CPU: 4 prompts x 4 episodes per step, 128 policy tokens and 256 tokens in all per episode.
DEFAULTS = {
    "model.path": "default",
    "model.dtype": "float32",
    "env.id": "rlvr/CalculatorArithmetic-v0",
    "env.kwargs": json.dumps({"digits": 3, "max_turns": 3}),
    "env.max_new_tokens": "128",
    "rollout.max_episode_tokens": "256",
    "env.eval_size": "32",
    "optim.lr": "1e-6",
    "rollout.prompts_per_step": "4",
    "rollout.group_size": "4",
    "loss.micro_batch_size": "8",
    "run.save_every": "10",
    # 24 steps of 8 demonstrations: the protocol, not the arithmetic (the calculator does that).
    "warm_start.steps": "24",
    "warm_start.batch_size": "8",
    "warm_start.lr": "3e-5",
}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default="runs/calculator")
    args, extra = parser.parse_known_args(argv)
    overrides = {**DEFAULTS, "run.steps": str(args.steps), "run.output_dir": args.out, "run.overwrite_output_dir": "true"}
    overrides.update(parse_overrides(extra))
    summary = grpo.train(load_config(grpo.GRPOConfig, overrides=overrides))
    warm = summary.get("eval_accuracy_warm_start")
    print(f"held-out accuracy: {summary['eval_accuracy_before']:.3f} -> "
          f"{'' if warm is None else f'{warm:.3f} (warm start) -> '}{summary['eval_accuracy_after']:.3f}")
    print(f"curves: {summary['plot']}")
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
