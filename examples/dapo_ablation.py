"""DAPO's ablation in miniature: GRPO, then each of DAPO's parts added in the paper's order, over several seeds.

The DAPO paper (arXiv 2503.14476, Qwen2.5-32B, AIME24 avg@32) reports: GRPO 30, + overlong filtering 36,
+ clip-higher 38, + soft overlong punishment 41, + token-level loss 42, + dynamic sampling 50. This script
reproduces the shape of that table on a CPU:

    python examples/dapo_ablation.py [--model tiny|default|PATH] [--seeds 5] [--steps 8] [--out runs/dapo-ablation]

``tiny`` (the default) is a character-level model supervised on 1-digit sums with a bias (65% of its answers
are off by one) and a habit of rambling past its answer (a share of its training answers run on), so
a small token budget truncates some completions: what overlong filtering and the soft penalty act on.
``default`` or a directory trains that model instead (the task's knobs below apply; expect minutes per run).
Every row trains the same model on the same problems with the same budget; only the DAPO parts differ.
Writes ``ablation.md`` (mean and spread of held-out greedy accuracy per row) and ``ablation.png``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from algos.algorithms import grpo
from algos.algorithms.grpo import GRPOConfig
from algos.config import load_config
from rlvr_env.testing import ADDITION_KWARGS, biased_addition_model

# The paper's rows: each adds one DAPO part to the row above (algos/algorithms/grpo.py DAPO_PRESET has all of them).
ROWS: list[tuple[str, dict[str, str]]] = [
    ("GRPO", {}),
    ("+ overlong filtering", {"grpo.overlong_filter": "true"}),
    ("+ clip-higher", {"loss.eps_high": "0.28"}),
    ("+ soft overlong punishment", {"grpo.soft_overlong": "true"}),
    ("+ token-level loss", {"loss.aggregation": "token-mean"}),
    ("+ dynamic sampling", {"grpo.dynamic_sampling": "true"}),
]
PAPER = {"GRPO": 30, "+ overlong filtering": 36, "+ clip-higher": 38, "+ soft overlong punishment": 41,
         "+ token-level loss": 42, "+ dynamic sampling": 50}


def row_overrides(args, model: str, index: int, seed: int, output_dir: Path) -> dict[str, str]:
    """GRPO without a KL term (as DAPO), plus the parts of rows 1..index."""
    values = {
        "model.path": model, "model.autocast": "null", "env.kwargs": json.dumps(ADDITION_KWARGS),
        "env.max_new_tokens": str(args.max_new_tokens), "env.use_chat_template": "false",
        "env.eval_size": str(args.eval_size), "optim.lr": str(args.lr), "run.steps": str(args.steps),
        "run.seed": str(seed), "run.output_dir": str(output_dir), "run.overwrite_output_dir": "true",
        "run.save_every": "0", "run.progress": "false", "run.tensorboard": "false", "run.plots": "false",
        "rollout.prompts_per_step": str(args.prompts), "rollout.group_size": str(args.group_size), "grpo.beta": "0",
        "grpo.num_iterations": str(args.iterations),
        "grpo.overlong_cache": str(max(1, args.max_new_tokens // 2)), "loss.micro_batch_size": "256",
    }
    for _, parts in ROWS[: index + 1]:
        values.update(parts)
    return values


def plot(results: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.bar(range(len(names)), [statistics.mean(v) for v in results.values()],
           yerr=[statistics.stdev(v) if len(v) > 1 else 0 for v in results.values()], capsize=4, color="tab:blue")
    for i, values in enumerate(results.values()):
        ax.scatter([i] * len(values), values, color="black", s=10, zorder=3)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title("DAPO's parts, added one by one (mean, spread and each seed)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="'tiny' (built here), 'default' (SmolLM2) or a directory")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=4, help="small, so a rambling completion is truncated")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--iterations", type=int, default=2,
                        help="updates per batch (grpo.num_iterations): with 1 the ratio is 1 and clip-higher never acts")
    parser.add_argument("--eval-size", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("runs/dapo-ablation"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model
    if model == "tiny":
        model = str(biased_addition_model(args.out / "tiny-model", rambling_fraction=0.3))
    results: dict[str, list[float]] = {}
    before = None
    started = time.perf_counter()
    for index, (name, _) in enumerate(ROWS):
        for seed in range(args.seeds):
            config = load_config(GRPOConfig, overrides=row_overrides(args, model, index, seed, args.out / "run"))
            summary = grpo.train(config)
            before = summary["eval_accuracy_before"]
            results.setdefault(name, []).append(summary["eval_accuracy_after"])
        values = results[name]
        print(f"{name:28s} {statistics.mean(values):.3f} +- {statistics.stdev(values) if len(values) > 1 else 0:.3f} "
              f"(seeds: {', '.join(f'{v:.3f}' for v in values)})", flush=True)
    lines = [
        f"DAPO's parts added one by one: model {args.model}, {args.prompts} prompts x {args.group_size} samples, "
        f"{args.steps} steps of {args.iterations} updates, lr {args.lr}, env.max_new_tokens {args.max_new_tokens}, "
        f"no KL, {args.seeds} seeds; "
        f"held-out greedy accuracy on {args.eval_size} problems (before training: {before:.3f}); "
        f"{time.perf_counter() - started:.0f} s in all.",
        "",
        "| row | accuracy (mean +- std over seeds) | change vs the row above | paper (AIME24, 32B) |",
        "|---|---|---|---|",
    ]
    previous = None
    for name, values in results.items():
        mean = statistics.mean(values)
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        change = "" if previous is None else f"{mean - previous:+.3f}"
        lines.append(f"| {name} | {mean:.3f} +- {spread:.3f} | {change} | {PAPER[name]} |")
        previous = mean
    (args.out / "ablation.md").write_text("\n".join(lines) + "\n")
    plot(results, args.out / "ablation.png")
    print("\n".join(lines))
    print(f"wrote {args.out / 'ablation.md'} and {args.out / 'ablation.png'}")


if __name__ == "__main__":
    main()
