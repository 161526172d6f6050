"""PPO vs GRPO vs DAPO on the same task, model and budget: a markdown table and a PNG plot.

    python examples/compare_algorithms.py --model PATH --out runs/compare [--steps 30]

Every algorithm starts from the same ``--model`` weights, sees the same number of
completions per step (``--prompts x --samples``), the same completion budget and
the same number of steps, and is evaluated greedily on the same held-out problems.
Per-algorithm knobs stay at their documented defaults except where noted in the
table (learning rate is shared). Writes ``comparison.md`` (table) and
``comparison.png`` (held-out accuracy and training reward per step) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from algos.algorithms import grpo, ppo
from algos.algorithms.grpo import DAPO_PRESET, GRPOConfig
from algos.config import load_config
from algos.run.reporting import read_metrics


def shared_overrides(args, output_dir: Path) -> dict[str, str]:
    return {
        "model.path": args.model,
        "env.id": args.env,
        "env.kwargs": args.task_kwargs,
        "env.max_new_tokens": str(args.max_new_tokens),
        "env.use_chat_template": str(args.chat_template).lower(),
        "env.eval_size": str(args.eval_size),
        "optim.lr": str(args.lr),
        "run.steps": str(args.steps),
        "run.eval_every": str(args.eval_every),
        "run.output_dir": str(output_dir),
        "run.overwrite_output_dir": "true",  # a rerun replaces the comparison
        "run.save_every": "0",
        "run.progress": "false",
        "run.tensorboard": "false",
        "run.seed": str(args.seed),
    }


def configs(args) -> dict[str, tuple[object, object]]:
    """name -> (train function, config), all over the same shared sections."""
    out = Path(args.out)
    grpo_budget = {"rollout.prompts_per_step": str(args.prompts), "rollout.group_size": str(args.samples),
                   "loss.micro_batch_size": str(args.prompts * args.samples), "grpo.overlong_cache": "2"}
    ppo_budget = {"rollout.prompts_per_step": str(args.prompts), "rollout.group_size": str(args.samples),
                  "loss.micro_batch_size": str(args.prompts * args.samples), "ppo.ppo_epochs": str(args.ppo_epochs)}
    return {
        "PPO": (ppo.train, load_config(ppo.PPOConfig, overrides={**shared_overrides(args, out / "ppo"), **ppo_budget})),
        "GRPO": (grpo.train, load_config(GRPOConfig, overrides={**shared_overrides(args, out / "grpo"), **grpo_budget,
                                                                 "grpo.beta": "0.0"})),
        "DAPO": (grpo.train, load_config(GRPOConfig, overrides={**shared_overrides(args, out / "dapo"), **grpo_budget},
                                         preset=DAPO_PRESET)),
    }


def plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, reward_ax) = plt.subplots(1, 2, figsize=(10, 3.5))
    for name, result in results.items():
        records = result["records"]
        evals = [(r["step"], r["eval_accuracy"]) for r in records if r.get("eval_accuracy") is not None]
        rewards = [(r["step"], r["reward_mean"]) for r in records if r.get("reward_mean") is not None]
        acc_ax.plot(*zip(*evals), marker="o", label=name)
        reward_ax.plot(*zip(*rewards), label=name)
    acc_ax.set(title="held-out greedy accuracy", xlabel="step")
    reward_ax.set(title="training reward (mean)", xlabel="step")
    for ax in (acc_ax, reward_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(results: dict[str, dict], args) -> str:
    lines = [
        f"Task {args.env} {args.task_kwargs}, model {args.model}; {args.steps} steps x {args.prompts} prompts x "
        f"{args.samples} samples, {args.max_new_tokens} new tokens, lr {args.lr}, held-out greedy eval on "
        f"{args.eval_size} problems.",
        "",
        "| algorithm | accuracy before | accuracy after | gain | final reward | wall time (s) | s / step |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        before, after = r["summary"]["eval_accuracy_before"], r["summary"]["eval_accuracy_after"]
        final_reward = [x["reward_mean"] for x in r["records"] if x.get("reward_mean") is not None][-1]
        lines.append(f"| {name} | {before:.3f} | {after:.3f} | {after - before:+.3f} | {final_reward:.3f} | "
                     f"{r['seconds']:.0f} | {r['seconds'] / args.steps:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default", help="local transformers directory, or 'default' (SmolLM2)")
    parser.add_argument("--out", default="runs/compare")
    parser.add_argument("--env", default="rlvr/Arithmetic-v0")
    parser.add_argument("--task-kwargs", default=json.dumps({"digits": 1, "terms": 2, "operators": "+"}),
                        help="task config as JSON")
    parser.add_argument("--chat-template", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=64, help="prompts per step")
    parser.add_argument("--samples", type=int, default=8, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--ppo-epochs", type=int, default=2)
    parser.add_argument("--eval-size", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="+", choices=["PPO", "GRPO", "DAPO"], help="run a subset")
    args = parser.parse_args(argv)

    results = {}
    for name, (train, config) in configs(args).items():
        if args.only and name not in args.only:
            continue
        started = time.perf_counter()
        summary = train(config)
        results[name] = {"summary": summary, "seconds": time.perf_counter() - started,
                         "records": read_metrics(config.run.output_dir)}
        print(f"{name}: {summary['eval_accuracy_before']:.3f} -> {summary['eval_accuracy_after']:.3f}", flush=True)
    out = Path(args.out)
    (out / "comparison.md").write_text(table(results, args))
    plot(results, out / "comparison.png")
    print((out / "comparison.md").read_text())
    print(f"plot: {out / 'comparison.png'}")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
