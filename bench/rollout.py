"""Tokens/s of the rollout engines stepping TokenVectorEnv vs. raw `model.generate` on the same batch.

All sample from the same model and prompts (rlvr/Arithmetic-v0 rendered through the
chat template) with the same settings. The stop token is set to one the model never
emits, so every row decodes exactly --new-tokens tokens in each and the work is equal.
Runs alternate between the contenders and the median of each is reported, with each engine's
ratio to generate: HFRollout's target is >= 0.9 (the CPU's engine), StaticRollout's >= 2 on a GPU.

``--task`` a multi-turn task (rlvr/CalculatorArithmetic-v0) compares the two ways to play its episodes instead,
greedy so both play the same ones: MultiTurnHFRollout (one KV cache across the turns, "hf") and EpisodeDriver over
StaticRollout.continue_rows (each turn prefilled whole, decoded in fixed shapes: "static"); the episodes' tokens
(the policy's and the observations) per second, and their ratio.

    python bench/rollout.py [--model default] [--batch 64] [--new-tokens 64] [--repeats 3] [--task ID]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from algos.model.loading import load_policy
from algos.rollout import HFRollout, is_multiturn_task
from algos.rollout.multiturn import EpisodeDriver, MultiTurnHFRollout
from algos.rollout.static import StaticRollout
from algos.system.hardware import choose_attention_kernels
from rlvr_env import TokenVectorEnv, make_task


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """This bench's flags, from ``argv`` (the command line's by default): tests/test_bench.py parses the GPU scripts'
    command lines with it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="'default' or a local transformers directory")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=64, help="rows per rollout (8 prompts x 8 samples)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--task", default="rlvr/Arithmetic-v0", help="a multi-turn task compares its episode players")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()

    model, tokenizer = load_policy(args.model, dtype=args.dtype)
    device = next(model.parameters()).device
    attention = choose_attention_kernels(device)  # as a run chooses them
    if is_multiturn_task(args.task):
        compare_episode_players(args, model, tokenizer, device, attention)
        return
    # An id that never ends a row, so both paths run the full --new-tokens steps.
    never_stop = tokenizer.unk_token_id if tokenizer.unk_token_id is not None else 0
    env = TokenVectorEnv(
        make_task(args.task), tokenizer, num_envs=args.batch, max_new_tokens=args.new_tokens,
        device=device, stop_token_ids=[never_stop],
    )
    engines = {"hf_rollout": HFRollout(seed=0), "static_rollout": StaticRollout(seed=0)}

    def rollout_with(name: str):
        def run_rollout() -> tuple[float, int]:
            env.reset(seed=0, options={"group_size": args.group_size})
            start = time.perf_counter()
            rollout = engines[name].generate(model, env)
            return time.perf_counter() - start, int(rollout.response_mask.sum())

        return run_rollout

    def run_generate() -> tuple[float, int]:
        env.reset(seed=0, options={"group_size": args.group_size})
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=env.prompt_ids, attention_mask=env.prompt_mask, max_new_tokens=args.new_tokens,
                do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                eos_token_id=never_stop, pad_token_id=env.pad_id,
            )
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start, int(out.shape[0] * (out.shape[1] - env.prompt_width))

    contenders = {"generate": run_generate, **{name: rollout_with(name) for name in engines}}
    medians = timed_medians(contenders, args, device, attention)
    targets = {"hf_rollout": 0.9, "static_rollout": 2.0 if device.type == "cuda" else 0.9}
    for name, target in targets.items():
        print(f"  ratio {name} / generate = {medians[name] / medians['generate']:.3f}  (target >= {target})")


def timed_medians(contenders: dict, args, device: torch.device, attention: str) -> dict[str, float]:
    """Each contender (() -> (seconds, tokens)) run once to warm up, then ``args.repeats`` times, alternating; prints
    every run and the medians -> each one's median tokens/s."""
    for fn in contenders.values():  # warm-up: allocator, kernels, the static engine's graph capture
        fn()
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.repeats):
        for name, fn in contenders.items():
            seconds, tokens = fn()
            rates[name].append(tokens / seconds)
            print(f"  {name}: {tokens} tokens in {seconds:.2f} s", flush=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"model {args.model} ({args.dtype}, {device}: {where}), {args.task}, batch {args.batch}, {args.new_tokens} "
          f"new tokens, {torch.get_num_threads()} threads, torch {torch.__version__}, attention {attention}, median of "
          f"{args.repeats}")
    for name, value in medians.items():
        print(f"  {name:14s} {value:9.1f} tokens/s   runs: {', '.join(f'{v:.1f}' for v in rates[name])}")
    return medians


def compare_episode_players(args, model, tokenizer, device: torch.device, attention: str) -> None:
    """A multi-turn task's greedy episodes played by MultiTurnHFRollout and by EpisodeDriver(StaticRollout): the
    episodes' tokens per second, the same episodes checked for both (bf16 may round a few apart)."""
    env = TokenVectorEnv(make_task(args.task), tokenizer, num_envs=args.batch, max_new_tokens=args.new_tokens,
                         device=device)
    players = {"multiturn_hf": MultiTurnHFRollout(), "static_driver": EpisodeDriver(StaticRollout())}
    played = {}

    def play_with(name: str):
        def run_episodes() -> tuple[float, int]:
            env.reset(seed=0, options={"group_size": args.group_size})
            start = time.perf_counter()
            played[name] = players[name].generate(model, env, greedy=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return time.perf_counter() - start, int(played[name].response_mask.sum())

        return run_episodes

    medians = timed_medians({name: play_with(name) for name in players}, args, device, attention)
    hf, static = played["multiturn_hf"], played["static_driver"]
    same = sum(a == b for a, b in zip(hf.completions, static.completions))
    print(f"  turns per episode {hf.turns.float().mean():.2f} (hf) {static.turns.float().mean():.2f} (static); "
          f"the same episode in {same} of {len(hf.completions)} rows")
    print(f"  ratio static_driver / multiturn_hf = {medians['static_driver'] / medians['multiturn_hf']:.3f}")


if __name__ == "__main__":
    main()
