"""Train a small Bradley-Terry reward model from preference pairs and save it.

    python examples/train_reward_model.py --out runs/rm                  # synthetic pairs, tiny model
    python examples/train_reward_model.py --pairs prefs.jsonl --init PATH --out runs/rm --optim.lr 1e-5

Any `--section.key value` pair sets algos/run/reward_model.py's RewardModelTrainConfig: [optim] (AdamW) and
[reward_model] (epochs, pairs_per_step, micro_batch_pairs, center_rewards_coef).

``--pairs`` is a JSONL file of {"prompt", "chosen", "rejected"} rows. Without
it the script writes synthetic arithmetic preferences: a well-formed
``\\boxed{N}`` final answer is preferred over a malformed one (no box,
unbalanced braces, ...), the format signal a verifier gives partial credit for.
``--init`` is a local causal-LM or reward-model directory; without it a tiny
randomly initialised Llama with a character tokenizer is built locally, so the
script runs offline in seconds. The saved directory loads with
``algos.model.reward.RewardModel.from_pretrained`` and plugs into
``rlvr train --algo ppo --ppo.reward_source model --ppo.reward_model DIR``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

from algos.config import load_config
from algos.model.reward import PreferencePair, RewardModel, load_preference_pairs, preference_accuracy
from algos.run.reward_model import RewardModelTrainConfig, train_bradley_terry

# This script's own defaults over RewardModelTrainConfig's, for the tiny model and the synthetic pairs:
# 2 epochs (one leaves some seeds' tiny models short of the format rule), lr 3e-3, 16 pairs a step.
PRESET = {"optim": {"lr": 3e-3}, "reward_model": {"epochs": 2, "pairs_per_step": 16, "micro_batch_pairs": 16}}


def synthetic_format_pairs(count: int, seed: int) -> list[PreferencePair]:
    """Arithmetic prompts; chosen = "\\boxed{N}", rejected = the same N in a broken format."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        a, b, n = rng.randrange(100), rng.randrange(100), rng.randrange(200)
        malformed = rng.choice([f"{n}", f"\\boxed{{{n}", f"{n}}}", f"boxed {n}", f"{{{n}}}"])
        pairs.append(PreferencePair(f"{a}+{b}=", f"\\boxed{{{n}}}", malformed))
    return pairs


def tiny_reward_model(seed: int) -> RewardModel:
    """A ~100k-parameter Llama sequence classifier over the character tokenizer (no download)."""
    from transformers import AutoModelForSequenceClassification

    from rlvr_env.testing import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    config = build_tiny_model(tokenizer, seed=seed).config
    config.num_labels = 1
    torch.manual_seed(seed)
    return RewardModel(AutoModelForSequenceClassification.from_config(config), tokenizer)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory to save the trained reward model to")
    parser.add_argument("--pairs", help="JSONL preference pairs (default: synthetic format preferences)")
    parser.add_argument("--init", help="local causal-LM or reward-model directory (default: tiny local model)")
    parser.add_argument("--num-pairs", type=int, default=256, help="synthetic pairs to generate (no --pairs)")
    parser.add_argument("--held-out", type=float, default=0.2, help="fraction of pairs kept for evaluation")
    parser.add_argument("--seed", type=int, default=0, help="the pairs' split and order, a fresh model's weights")
    args, overrides = parser.parse_known_args(argv)
    config = load_config(RewardModelTrainConfig, overrides=[*overrides, "--reward_model.seed", str(args.seed)],
                         preset=PRESET)
    if not 0.0 < args.held_out < 1.0:
        parser.error(f"--held-out must be in (0, 1), got {args.held_out}")
    torch.manual_seed(args.seed)  # a fresh score head (--init) and dropout draw from torch's RNG

    pairs = load_preference_pairs(args.pairs) if args.pairs else synthetic_format_pairs(args.num_pairs, args.seed)
    random.Random(args.seed).shuffle(pairs)
    num_held_out = max(1, int(len(pairs) * args.held_out))
    held_out, train = pairs[:num_held_out], pairs[num_held_out:]
    if not train:
        parser.error(f"only {len(pairs)} pairs: nothing left to train on after holding out {num_held_out}")

    reward_model = RewardModel.from_pretrained(args.init) if args.init else tiny_reward_model(args.seed)
    before = preference_accuracy(reward_model, held_out)
    history = train_bradley_terry(reward_model, train, config)
    summary = {
        "train_pairs": len(train),
        "held_out_pairs": len(held_out),
        "held_out_accuracy_before": before,
        "held_out_accuracy_after": preference_accuracy(reward_model, held_out),
        "final_loss": history[-1]["loss"],
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    reward_model.save_pretrained(args.out)
    (Path(args.out) / "bt_summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    print(f"saved reward model to {args.out}")
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
