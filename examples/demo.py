"""`make demo`: GRPO (or DAPO) on the embedded SmolLM2-135M-Instruct and rlvr/Arithmetic-v0.

Converts the embedded model on first use, measures held-out greedy accuracy, trains
on the CPU (about 15 minutes on 2 cores with examples/demo.toml), measures again, and
prints both accuracies and the path of the training-curve plot.

    python examples/demo.py [--algo grpo|dapo] [--config examples/demo.toml] [--run.steps 5 ...]

Any further `--section.key value` pair overrides the config file (see algos/config.py).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from algos.algorithms import grpo
from algos.algorithms.grpo import GRPOConfig
from algos.config import load_config
from algos.model.loading import default_model_path
from algos.run.evaluation import evaluate_saved_model
from algos.system.paths import latest_checkpoint

DEFAULT_CONFIG = Path(__file__).with_name("demo.toml")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=("grpo", "dapo"), default="grpo")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="TOML/YAML run config")
    args, overrides = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the machine and the precision the run picks
    config = load_config(GRPOConfig, args.config, overrides=overrides, preset=grpo.PRESETS.get(args.algo))

    started = time.perf_counter()
    if config.model.path == "default":
        print("Preparing the embedded SmolLM2-135M-Instruct (converted once, then cached)...", flush=True)
        print(f"  model directory: {default_model_path()}", flush=True)
    print(
        f"Training {args.algo.upper()} on {config.env.id} {config.env.kwargs} for {config.run.steps} steps "
        f"({config.rollout.prompts_per_step} prompts x {config.rollout.group_size} samples); "
        f"held-out greedy accuracy on {config.env.eval_size} problems before and after.",
        flush=True,
    )
    summary = grpo.train(config)
    # What a user gets: the saved checkpoint, loaded afresh, scored like `rlvr eval` does.
    checkpoint = latest_checkpoint(summary["output_dir"]) / "model"
    reloaded = evaluate_saved_model(config, checkpoint)
    minutes = (time.perf_counter() - started) / 60
    before, after = summary["eval_accuracy_before"], summary["eval_accuracy_after"]
    print()
    print(f"held-out accuracy before: {before:6.1%}")
    print(f"held-out accuracy after:  {after:6.1%}   ({(after - before) * 100:+.1f} points)")
    print(f"saved checkpoint, reloaded: {reloaded:6.1%}   ({checkpoint})")
    print(f"training curves: {summary['plot']}")
    print(f"run directory:   {summary['output_dir']}   (metrics.jsonl, checkpoint, config.yaml)")
    print(f"wall time: {minutes:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
