"""Where one GRPO step's time goes on a GPU: the share of its wall time the GPU is busy, from a torch.profiler trace.

Runs GRPOTrainer as bench/grpo_step.py's "ours" does (P prompts x G samples of rlvr/Arithmetic-v0, N new tokens,
beta 0), warms up with one step, then profiles the next (collect, then update) and prints

- the wall time of each phase and the GPU's busy time in it (the union of its kernels' intervals), and their ratio;
- the ops with the most CPU time and the kernels with the most GPU time.

A step whose kernels fill less than half its wall time is launch- or host-bound. On a CPU it prints the CPU ops alone.

    python bench/profile_step.py [--model default] [--precision bf16] [--rollout-backend static|hf] [--compile-layers auto|on|off]
        [--trace FILE]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from gpu_busy import busy_in, host_range, kernel_intervals
from torch.profiler import ProfilerActivity, profile, record_function


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """This bench's flags, from ``argv`` (the command line's by default): tests/test_bench.py parses the GPU scripts'
    command lines with it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rollout-backend", default="auto", help="rollout.backend (auto: static on a GPU)")
    parser.add_argument("--compile-layers", default="auto", help="model.compile_layers (auto: on on a GPU)")
    parser.add_argument("--top", type=int, default=12, help="rows of each table")
    parser.add_argument("--trace", help="also write the Chrome trace here")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()

    from algos.algorithms.grpo import GRPOConfig, GRPOTrainer
    from algos.config import load_config
    from algos.system.runtime import mixed_precision

    config = load_config(GRPOConfig, overrides={
        "model.path": args.model, "model.autocast": "bfloat16" if args.precision == "bf16" else "null",
        "env.max_new_tokens": str(args.new_tokens), "run.output_dir": tempfile.mkdtemp(), "run.steps": "2",
        "run.progress": "false", "run.tensorboard": "false", "rollout.prompts_per_step": str(args.prompts),
        "rollout.group_size": str(args.group_size), "grpo.beta": "0", "optim.lr": "1e-6",
        "rollout.backend": args.rollout_backend, "model.compile_layers": args.compile_layers,
    })
    trainer = GRPOTrainer(config)
    gpu = trainer.run.device.type == "cuda"

    def sync() -> float:
        if gpu:
            torch.cuda.synchronize()
        return time.perf_counter()

    def step(number: int, phases: dict[str, tuple[float, float]]) -> None:
        with mixed_precision(trainer.config.model, trainer.run.device):
            started = sync()
            with record_function("collect"):
                batch, _ = trainer.collect(number)
            collected = sync()
            with record_function("update"):
                if batch is not None:
                    trainer.update(batch)
            phases.update(collect=(started, collected), update=(collected, sync()))

    step(1, {})  # warm-up: allocator, kernels, the static engine's graph capture
    phases: dict[str, tuple[float, float]] = {}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=activities) as prof:
        step(2, phases)
    if args.trace:
        prof.export_chrome_trace(args.trace)

    events = prof.events()
    ranges = {name: host_range(events, name) for name in phases}
    # The GPU's own events, less the record_function ranges the profiler mirrors onto the GPU timeline
    kernels = kernel_intervals(events, phases)
    where = torch.cuda.get_device_name() if gpu else "cpu"
    print(f"profile of one GRPO step: {args.model} ({args.precision}) on {where}, torch {torch.__version__}, "
          f"rollout.backend {trainer.config.rollout.backend}, {args.prompts} x {args.group_size} rows, "
          f"{args.new_tokens} new tokens")
    total_wall = total_busy = 0.0
    for name, (start, end) in phases.items():
        wall = end - start
        line = f"  {name:8s} wall {wall:6.3f} s"
        if gpu:
            first, last = ranges[name]
            busy = busy_in(kernels, first, last)
            total_busy += busy
            line += f"  GPU busy {busy:6.3f} s ({100 * busy / wall:5.1f}%)"
        total_wall += wall
        print(line)
    if gpu:
        print(f"  step     wall {total_wall:6.3f} s  GPU busy {total_busy:6.3f} s ({100 * total_busy / total_wall:5.1f}%)"
              f"  kernels {len(kernels)}")
    table = prof.key_averages()
    print(table.table(sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=60))
    if gpu:
        print(table.table(sort_by="self_device_time_total", row_limit=args.top, max_name_column_width=60))


if __name__ == "__main__":
    main()
