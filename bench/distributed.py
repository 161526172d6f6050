"""Step time and peak memory per rank of a GRPO step on 1 and on 2 ranks (torchrun), side by side.

Work: one global batch (P prompts x G samples of rlvr/Arithmetic-v0, N new tokens, beta 0), the same whatever the
number of ranks: 2 ranks each sample and train half of it. Each configuration runs under its own torchrun; every
rank times its second step (the first warms up) and reports its peak memory (RSS on CPU, allocated GPU memory on a
GPU). On a CPU the ranks share the machine's cores (torch threads are split between them), so 2 ranks show the cost
of the collectives and of each rank's own copy rather than a speed-up; on GPUs each rank has its own device.

    python bench/distributed.py [--model tiny|default|PATH] [--ranks 1 2] [--strategies ddp fsdp2] [--prompts 8] ...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_step import now, peak_memory, tiny_model_dir  # noqa: E402

from algos.system.memory import rss_gb  # noqa: E402


def run_rank(args) -> None:
    """One rank of one configuration (under torchrun): two GRPO steps; rank 0 prints every rank's numbers."""
    from algos.algorithms.grpo import GRPOConfig, GRPOTrainer
    from algos.config import load_config
    from algos.system.distributed import gather_objects, leave
    from algos.system.runtime import mixed_precision

    baseline = rss_gb()
    config = load_config(GRPOConfig, overrides={
        "model.path": args.model, "model.autocast": args.autocast or "null", "env.max_new_tokens": str(args.new_tokens),
        "run.output_dir": args.output_dir, "run.steps": "2", "run.progress": "false", "run.tensorboard": "false",
        "rollout.prompts_per_step": str(args.prompts), "rollout.group_size": str(args.group_size), "grpo.beta": "0",
        "optim.lr": "1e-6", "distributed.strategy": args.strategy, "loss.micro_batch_size": str(args.micro_batch),
    })
    trainer = GRPOTrainer(config)
    for step in (1, 2):
        started = now()
        with mixed_precision(trainer.config.model, trainer.run.device):  # as run_training does
            batch, _ = trainer.collect(step)
            collected = now()
            trainer.update(batch)
        finished = now()
    mine = {"generate_s": collected - started, "train_s": finished - collected, "step_s": finished - started,
            "rows": batch.num_rows if batch is not None else 0, **peak_memory(baseline)}
    ranks = gather_objects(mine)
    if trainer.run.world.is_main:
        print(json.dumps(ranks))
    leave()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="'tiny' (built locally), 'default' (SmolLM2) or a directory")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="matmuls (model.autocast)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--strategies", nargs="+", default=["ddp", "fsdp2"], choices=["ddp", "fsdp2"])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", help=argparse.SUPPRESS)
    parser.add_argument("--autocast", help=argparse.SUPPRESS)
    parser.add_argument("--output-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_worker:
        run_rank(args)
        return

    import torch

    from algos.system.hardware import describe_machine

    root = Path(tempfile.mkdtemp())
    model = tiny_model_dir(root) if args.model == "tiny" else args.model
    if model == "default":
        from algos.model.loading import default_model_path

        model = str(default_model_path())
    autocast = {"fp32": "", "bf16": "bfloat16"}[args.precision]
    machine = describe_machine(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    print(f"machine: {machine.get('gpu') or machine['cpu']}, CPU capability {machine['cpu_capability']}, bf16 units "
          f"{'/'.join(machine['cpu_bf16_units']) or 'none'}, {machine['cpu_cores']} cores, torch {machine['torch']}")
    print(f"one GRPO step of the same global batch: {args.prompts} prompts x {args.group_size} samples, "
          f"{args.new_tokens} new tokens, model {args.model}, matmuls {args.precision}, {args.micro_batch} rows per "
          f"forward/backward")
    cores = machine["cpu_cores"] or 1
    baseline = None
    for ranks in args.ranks:
        for strategy in args.strategies if ranks > 1 else ["none"]:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
                       __file__, "--rank-worker", "--model", model, "--strategy", "ddp" if ranks == 1 else strategy,
                       "--autocast", autocast, "--output-dir", str(root / f"run-{ranks}-{strategy}"),
                       "--prompts", str(args.prompts), "--group-size", str(args.group_size),
                       "--new-tokens", str(args.new_tokens), "--micro-batch", str(args.micro_batch)]
            # The cores are shared: each rank gets its share of torch threads (torchrun's default is 1).
            env = {**os.environ, "OMP_NUM_THREADS": str(max(1, cores // ranks))}
            proc = subprocess.run(command, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                print(f"{ranks} ranks {strategy}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
                continue
            per_rank = json.loads(proc.stdout.strip().splitlines()[-1])
            slowest = max(r["step_s"] for r in per_rank)
            memory = "peak_gpu_gb" if "peak_gpu_gb" in per_rank[0] else "peak_rss_gb"
            baseline = baseline or (slowest, max(r[memory] for r in per_rank))
            print(f"  {ranks} rank{'s' if ranks > 1 else ' '} {strategy:5s} step {slowest:7.2f} s (x{slowest / baseline[0]:.2f}"
                  f" vs 1 rank) | per rank: " + "; ".join(
                      f"rank {i}: {r['rows']} rows, {r['step_s']:.2f} s (generate {r['generate_s']:.2f} + train "
                      f"{r['train_s']:.2f}), peak {r[memory]:.2f} GB{' GPU' if memory == 'peak_gpu_gb' else ''} "
                      f"(x{r[memory] / baseline[1]:.2f})" for i, r in enumerate(per_rank)))


if __name__ == "__main__":
    main()
