"""What tests/test_distributed.py launches under torchrun: `rlvr train` in-process, checking after every step that all
ranks hold identical weights, and optionally making one rank's loss non-finite at one step.

    torchrun --standalone --nproc_per_node=2 tests/distributed_worker.py ALGO [--nan-on-rank R --nan-at-step S] \
        [--section.key value ...] [--then ALGO ...]

Each `--then` starts another run, trained after the one before it in the same processes: one launch (and one set of
imports) for many runs.

Every rank's weights after step s are summarised as the float64 sums of |w|, of w * (index + 1) and of
|w| * (index + 1) (the scale of the second, whose terms cancel) over each tensor (the whole tensor: under FSDP2 each
rank's shards are gathered), written by rank 0 to run.output_dir/weights.jsonl.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
from pathlib import Path

import torch

from algos.algorithms import grpo, ppo
from algos.config import load_config, parse_overrides
from algos.core import POLICY_LOSSES
from algos.system.distributed import current_world, gather_objects, leave

TRAINERS = {"grpo": (grpo.GRPOTrainer, grpo.GRPOConfig, None), "dapo": (grpo.GRPOTrainer, grpo.GRPOConfig, grpo.DAPO_PRESET),
            "ppo": (ppo.PPOTrainer, ppo.PPOConfig, None)}


def weights_summary(modules: torch.nn.Module) -> dict[str, list[float]]:
    summary = {}
    for name, tensor in modules.state_dict().items():
        whole = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        flat = whole.detach().double().flatten()
        index = torch.arange(1, flat.numel() + 1, dtype=torch.float64)
        summary[name] = [flat.abs().sum().item(), (flat * index).sum().item(), (flat.abs() * index).sum().item()]
    return summary


def main() -> None:
    argv = sys.argv[1:]
    runs = [[]]
    for arg in argv:
        if arg == "--then":
            runs.append([])
        else:
            runs[-1].append(arg)
    try:
        for run in runs:
            train(run)
    finally:
        leave()


def train(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("algo", choices=sorted(TRAINERS))
    parser.add_argument("--nan-on-rank", type=int)
    parser.add_argument("--nan-at-step", type=int)
    parser.add_argument("--kill-rank", type=int)  # SIGKILL this rank inside the update of --kill-at-step
    parser.add_argument("--kill-at-step", type=int)
    parser.add_argument("--resume", action="store_true")
    args, rest = parser.parse_known_args(argv)
    trainer_type, config_type, preset = TRAINERS[args.algo]
    config = load_config(config_type, overrides=parse_overrides(rest), preset=preset)
    trainer = trainer_type(config, resume=args.resume)
    world = current_world()
    record = Path(config.run.output_dir) / "weights.jsonl"
    step_of_run = trainer.train_step

    trainer_step = [0]

    def checked_step(step, logger):
        trainer_step[0] = step
        surrogate = POLICY_LOSSES[config.loss.surrogate]
        if step == args.nan_at_step and world.rank == args.nan_on_rank:
            def poisoned(*a, **k):
                out = surrogate(*a, **k)
                out.per_token_loss = out.per_token_loss * math.nan
                return out

            POLICY_LOSSES[config.loss.surrogate] = poisoned
        try:
            metrics = step_of_run(step, logger)
        finally:
            POLICY_LOSSES[config.loss.surrogate] = surrogate
        ranks = gather_objects(weights_summary(trainer.run.modules))
        if any(summary != ranks[0] for summary in ranks):
            raise AssertionError(f"step {step}: the ranks' weights differ")
        if world.is_main:
            with record.open("a") as fh:
                fh.write(json.dumps({"step": step, "skipped": metrics.get("skipped_update", metrics.get("skipped_updates")),
                                     "weights": ranks[0]}) + "\n")
        return metrics

    trainer.train_step = checked_step
    if world.rank == args.kill_rank:
        update, killed_at = trainer.update, args.kill_at_step

        def killed_update(*a, **k):
            if trainer_step[0] == killed_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return update(*a, **k)

        trainer.update = killed_update
    trainer.train()


if __name__ == "__main__":
    main()
