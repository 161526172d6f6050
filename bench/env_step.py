"""Steps/s of TokenVectorEnv against a gymnasium SyncVectorEnv of TokenEnvs on the same rows.

Both replay the same pre-drawn token actions (EOS with a small probability per
step, so rows finish at different steps and get scored as they do) for one full
rollout of MAX_NEW_TOKENS steps, and each row's episode is scored exactly once on
both sides; the ratio is measured in this run. Every repeat draws new actions (the
verifier caches parses, and a rollout never repeats the last one's text), and the
medians are reported. Scoring the B completions is the same work on both sides, so
the script also times it alone: it bounds the ratio. It also times the bare tensor
steps (no row ending): with scoring, a tighter bound that only decoding and
per-row bookkeeping stand between. With ``--model`` (a local model
directory or "default", the embedded SmolLM2) it also times that model's decode step on
the same batch size, to put the env's per-step cost next to the work it sits beside.
    python bench/env_step.py [--batch 64] [--max-new-tokens 128] [--device cpu] [--model default]
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np
import torch

import rewards
import rlvr_env
from rlvr_env.testing import build_char_tokenizer


def draw_actions(tokenizer, batch: int, steps: int, eos_probability: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    digits = [tokenizer.convert_tokens_to_ids(c) for c in "0123456789 "]
    actions = rng.choice(digits, size=(steps, batch))
    actions[rng.random((steps, batch)) < eos_probability] = tokenizer.eos_token_id
    return actions


def arithmetic_env(tokenizer, batch: int, steps: int, device: str) -> rlvr_env.TokenVectorEnv:
    return rlvr_env.TokenVectorEnv(rlvr_env.make_task("Arithmetic"), tokenizer, num_envs=batch, max_new_tokens=steps,
                                   device=device)


def run_vector(tokenizer, actions: np.ndarray, device: str) -> tuple[float, int]:
    steps, batch = actions.shape
    env = arithmetic_env(tokenizer, batch, steps, device)
    env.reset(seed=0)
    moves = torch.as_tensor(actions, device=device)
    start, taken = time.perf_counter(), 0
    while not env.all_done:
        env.step(moves[taken])
        taken += 1
    env.results()
    if device != "cpu":
        torch.cuda.synchronize()
    return time.perf_counter() - start, taken


def time_scoring(tokenizer, actions: np.ndarray, device: str) -> float:
    """Seconds to decode and score the batch's finished completions alone, in one batch."""
    steps, batch = actions.shape
    env = arithmetic_env(tokenizer, batch, steps, device)
    env.reset(seed=0)
    for step in range(steps):
        if env.all_done:
            break
        env.step(torch.as_tensor(actions[step], device=device))
    result = env.results()
    lengths = (result.response_mask.sum(1) - (~result.truncated).long()).tolist()
    responses = [ids[:n] for ids, n in zip(result.response_ids.tolist(), lengths)]
    start = time.perf_counter()
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    rewards.score_batch(texts, [p.answer for p in result.problems], verifier=env.task.verifier)
    return time.perf_counter() - start


def time_bare_steps(tokenizer, batch: int, steps: int, device: str) -> float:
    """Seconds of ``steps - 1`` steps in which no row ends: the tensor work alone, no decoding or scoring."""
    env = arithmetic_env(tokenizer, batch, steps, device)
    env.reset(seed=0)
    digit = torch.full((batch,), tokenizer.convert_tokens_to_ids("7"), device=device)
    start = time.perf_counter()
    for _ in range(steps - 1):
        env.step(digit)
    if device != "cpu":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def run_sync(tokenizer, actions: np.ndarray) -> tuple[float, int]:
    steps, batch = actions.shape

    def make():
        return rlvr_env.TokenEnv(rlvr_env.make_task("Arithmetic"), tokenizer, max_new_tokens=steps)

    # SAME_STEP: a finished row restarts inside the step, so each row counts one episode like the vector env.
    envs = gym.vector.SyncVectorEnv([make] * batch, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.reset(seed=0)
    done = np.zeros(batch, dtype=bool)
    # A finished row's restarted episode gets a token that never ends it: one scored episode per row.
    filler = tokenizer.convert_tokens_to_ids(" ")
    start, taken = time.perf_counter(), 0
    while not done.all():
        _, _, terminated, truncated, _ = envs.step(np.where(done, filler, actions[taken]))
        done |= terminated | truncated
        taken += 1
    return time.perf_counter() - start, taken


@torch.no_grad()
def time_decode_step(model_path: str, batch: int, device: str, steps: int = 8) -> float:
    """Median seconds of one KV-cached decode step of the model on ``batch`` Arithmetic prompts."""
    from algos.model.loading import load_policy

    model, tokenizer = load_policy(model_path, device=device)
    env = arithmetic_env(tokenizer, batch, steps, device)
    env.reset(seed=0)
    mask = env.prompt_mask
    out = model(input_ids=env.prompt_ids, attention_mask=mask, use_cache=True)
    cache, tokens = out.past_key_values, out.logits[:, -1:].argmax(-1)
    seconds = []
    for _ in range(steps):
        mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)
        start = time.perf_counter()
        out = model(input_ids=tokens, attention_mask=mask, past_key_values=cache, use_cache=True)
        tokens = out.logits[:, -1:].argmax(-1)
        if device != "cpu":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--eos-probability", type=float, default=0.02)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--model", help='also time this model\'s decode step at the same batch ("default" = embedded SmolLM2)')
    args = parser.parse_args()
    tokenizer = build_char_tokenizer()

    def fresh_actions(seed: int) -> np.ndarray:
        return draw_actions(tokenizer, args.batch, args.max_new_tokens, args.eos_probability, seed)

    run_vector(tokenizer, fresh_actions(-1 % 2**32)[:4], args.device)  # warm-up (allocation, first CUDA calls)
    vector_runs, sync_runs, scoring_runs, bare_runs = [], [], [], []
    for repeat in range(args.repeats):
        actions = fresh_actions(repeat)
        vector_runs.append(run_vector(tokenizer, actions, args.device))
        sync_runs.append(run_sync(tokenizer, actions))
        # Scoring alone on another draw of the same distribution: these texts were not parsed yet.
        scoring_runs.append(time_scoring(tokenizer, fresh_actions(10_000 + repeat), args.device))
        bare_runs.append(time_bare_steps(tokenizer, args.batch, args.max_new_tokens, args.device))
    vector_rate = statistics.median(steps / seconds for seconds, steps in vector_runs)
    sync_rate = statistics.median(steps / seconds for seconds, steps in sync_runs)
    vector_seconds = statistics.median(seconds for seconds, _ in vector_runs)
    sync_seconds = statistics.median(seconds for seconds, _ in sync_runs)
    scoring = statistics.median(scoring_runs)
    bare = statistics.median(bare_runs)
    print(f"B={args.batch} max_new_tokens={args.max_new_tokens} device={args.device}, median of {args.repeats} fresh rollouts")
    print(f"TokenVectorEnv           {vector_rate:10.1f} batch steps/s  ({vector_rate * args.batch:10.0f} row-steps/s)")
    print(f"SyncVectorEnv(TokenEnv)  {sync_rate:10.1f} batch steps/s  ({sync_rate * args.batch:10.0f} row-steps/s)")
    print(f"ratio                    {vector_rate / sync_rate:10.1f}x  (target >= 20x at B=64)")
    print(f"scoring alone            {scoring * 1e3:10.2f} ms per rollout = {scoring / vector_seconds:.0%} of "
          f"TokenVectorEnv's time; ratio bound with free stepping {sync_seconds / scoring:.1f}x")
    per_step_us = bare / (args.max_new_tokens - 1) * 1e6
    print(f"bare tensor steps        {bare * 1e3:10.2f} ms per rollout ({per_step_us:.1f} us/step, no row ending);"
          f" ratio bound with free decoding and bookkeeping {sync_seconds / (scoring + bare):.1f}x")
    if args.model:
        decode = time_decode_step(args.model, args.batch, args.device)
        env_step = vector_seconds / args.max_new_tokens  # scoring included, spread over the rollout's steps
        print(f"model decode step        {decode * 1e3:10.2f} ms at B={args.batch} ({args.model});"
              f" one TokenVectorEnv step ({env_step * 1e6:.0f} us, scoring included) = {env_step / decode:.3%} of it")


if __name__ == "__main__":
    main()
