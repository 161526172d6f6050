"""PPO on the default model (SmolLM2-135M-Instruct, embedded) and 2-digit addition, on CPU or GPU.

    python examples/ppo_default_model.py [--steps 20] [--out runs/ppo-default] [--key value ...]

Prints held-out greedy accuracy before and after training and the path of the
curves' PNG. Extra ``--section.key value`` arguments override the config below,
e.g. ``--ppo.value_model separate`` or ``--ppo.kl_target 6``.
"""

from __future__ import annotations

import argparse
import json
import sys

from algos.algorithms import ppo
from algos.config import load_config, parse_overrides

# Small enough for a CPU: 8 prompts x 4 samples of at most 48 tokens per step.
DEFAULTS = {
    "model.path": "default",
    "model.dtype": "float32",
    "env.id": "rlvr/Arithmetic-v0",
    "env.kwargs": json.dumps({"digits": 2, "terms": 2, "operators": "+"}),
    "env.max_new_tokens": "48",
    "env.eval_size": "50",
    "optim.lr": "1e-6",  # DeepSeekMath/InstructGPT range for the actor; the critic gets 10x
    "rollout.prompts_per_step": "8",
    "rollout.group_size": "4",
    "loss.micro_batch_size": "8",
    "ppo.value_model": "head",
    "ppo.critic_warmup_steps": "2",  # let the fresh value head fit returns before the policy moves
    "ppo.kl_coef": "0.02",
    "run.save_every": "10",
}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default="runs/ppo-default")
    args, extra = parser.parse_known_args(argv)
    overrides = {**DEFAULTS, "run.steps": str(args.steps), "run.output_dir": args.out, "run.overwrite_output_dir": "true"}
    overrides.update(parse_overrides(extra))
    summary = ppo.train(load_config(ppo.PPOConfig, overrides=overrides))
    print(f"held-out accuracy: {summary['eval_accuracy_before']:.3f} -> {summary['eval_accuracy_after']:.3f}")
    print(f"curves: {summary['plot']}")
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
