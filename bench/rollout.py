"""Tokens/s of HFRollout stepping TokenVectorEnv vs. raw `model.generate` on the same batch.

Both sample from the same model and prompts (rlvr/Arithmetic-v0 rendered through the
chat template) with the same settings. The stop token is set to one the model never
emits, so every row decodes exactly --new-tokens tokens in both and the work is equal.
Runs alternate between the two and the median of each is reported; the ratio
HFRollout / generate is the number to watch (target >= 0.9).

    python bench/rollout.py [--model default] [--batch 64] [--new-tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from algos.models import load_policy
from algos.rollout import HFRollout
from rlvr_env import TokenVectorEnv, make_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="'default' or a local transformers directory")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=64, help="rows per rollout (8 prompts x 8 samples)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    model, tokenizer = load_policy(args.model, dtype=args.dtype)
    device = next(model.parameters()).device
    # An id that never ends a row, so both paths run the full --new-tokens steps.
    never_stop = tokenizer.unk_token_id if tokenizer.unk_token_id is not None else 0
    env = TokenVectorEnv(
        make_task("rlvr/Arithmetic-v0"), tokenizer, num_envs=args.batch, max_new_tokens=args.new_tokens,
        device=device, stop_token_ids=[never_stop],
    )
    backend = HFRollout(seed=0)

    def run_rollout() -> tuple[float, int]:
        env.reset(seed=0, options={"group_size": args.group_size})
        start = time.perf_counter()
        rollout = backend.generate(model, env)
        return time.perf_counter() - start, int(rollout.response_mask.sum())

    def run_generate() -> tuple[float, int]:
        env.reset(seed=0, options={"group_size": args.group_size})
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=env.prompt_ids, attention_mask=env.prompt_mask, max_new_tokens=args.new_tokens,
                do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                eos_token_id=never_stop, pad_token_id=env.pad_id,
            )
        return time.perf_counter() - start, int(out.shape[0] * (out.shape[1] - env.prompt_width))

    run_rollout(), run_generate()  # warm-up: allocator, kernels
    rates: dict[str, list[float]] = {"generate": [], "hf_rollout": []}
    for _ in range(args.repeats):
        for name, fn in (("generate", run_generate), ("hf_rollout", run_rollout)):
            seconds, tokens = fn()
            rates[name].append(tokens / seconds)
            print(f"  {name}: {tokens} tokens in {seconds:.2f} s", flush=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(f"model {args.model} ({args.dtype}, {device}), batch {args.batch}, {args.new_tokens} new tokens, "
          f"{torch.get_num_threads()} threads, median of {args.repeats}")
    for name, value in medians.items():
        print(f"  {name:11s} {value:8.1f} tokens/s   runs: {', '.join(f'{v:.1f}' for v in rates[name])}")
    print(f"  ratio hf_rollout / generate = {medians['hf_rollout'] / medians['generate']:.3f}  (target >= 0.90)")


if __name__ == "__main__":
    main()
