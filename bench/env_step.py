"""Steps/s of TokenVectorEnv against a gymnasium SyncVectorEnv of TokenEnvs on the same rows.

Both replay the same pre-drawn token actions (EOS with a small probability per
step, so rows finish at different steps and get scored as they do) for one full
rollout of MAX_NEW_TOKENS steps; the ratio is measured in this run.
    python bench/env_step.py [--batch 64] [--max-new-tokens 128] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch

import rlvr_env
from rlvr_env.testing import build_char_tokenizer


def draw_actions(tokenizer, batch: int, steps: int, eos_probability: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    digits = [tokenizer.convert_tokens_to_ids(c) for c in "0123456789 "]
    actions = rng.choice(digits, size=(steps, batch))
    actions[rng.random((steps, batch)) < eos_probability] = tokenizer.eos_token_id
    return actions


def run_vector(tokenizer, actions: np.ndarray, device: str) -> tuple[float, int]:
    steps, batch = actions.shape
    env = rlvr_env.TokenVectorEnv(rlvr_env.make_task("Arithmetic"), tokenizer, num_envs=batch, max_new_tokens=steps, device=device)
    env.reset(seed=0)
    moves = torch.as_tensor(actions, device=device)
    start, taken = time.perf_counter(), 0
    while not env.all_done:
        env.step(moves[taken])
        taken += 1
    if device != "cpu":
        torch.cuda.synchronize()
    return time.perf_counter() - start, taken


def run_sync(tokenizer, actions: np.ndarray) -> tuple[float, int]:
    steps, batch = actions.shape

    def make():
        return rlvr_env.TokenEnv(rlvr_env.make_task("Arithmetic"), tokenizer, max_new_tokens=steps)

    # SAME_STEP: a finished row restarts inside the step, so each row counts one episode like the vector env.
    envs = gym.vector.SyncVectorEnv([make] * batch, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.reset(seed=0)
    done = np.zeros(batch, dtype=bool)
    start, taken = time.perf_counter(), 0
    while not done.all():
        _, _, terminated, truncated, _ = envs.step(actions[taken])
        done |= terminated | truncated
        taken += 1
    return time.perf_counter() - start, taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--eos-probability", type=float, default=0.02)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tokenizer = build_char_tokenizer()
    actions = draw_actions(tokenizer, args.batch, args.max_new_tokens, args.eos_probability, seed=0)
    run_vector(tokenizer, actions[:4], args.device)  # warm-up (allocation, first CUDA calls)
    vector = min(run_vector(tokenizer, actions, args.device) for _ in range(args.repeats))
    sync = min(run_sync(tokenizer, actions) for _ in range(args.repeats))
    vector_rate, sync_rate = vector[1] / vector[0], sync[1] / sync[0]
    print(f"B={args.batch} max_new_tokens={args.max_new_tokens} device={args.device} steps={vector[1]}")
    print(f"TokenVectorEnv           {vector_rate:10.1f} batch steps/s  ({vector_rate * args.batch:10.0f} row-steps/s)")
    print(f"SyncVectorEnv(TokenEnv)  {sync_rate:10.1f} batch steps/s  ({sync_rate * args.batch:10.0f} row-steps/s)")
    print(f"ratio                    {vector_rate / sync_rate:10.1f}x  (target >= 20x at B=64)")


if __name__ == "__main__":
    main()
