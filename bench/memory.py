"""Peak memory of one GRPO step by rows and completion length, so a user can size a run.

A step's memory is measured in its parts, per model, in the precision model.autocast "auto" picks here
(--precision to force one), with the default micro-batch (loss.micro_batch_size rows):

  resident  the process with the model, its gradients and AdamW state: RSS after one optimizer step
  rollout   the KV cache when every row has generated its last token: rows x (prompt + tokens) x the
            model's K/V bytes per token (transformers' DynamicCache), plus one step's logits
  update    one micro-batch's activations kept for backward (saved-tensor bytes of completion_logprobs
            on that width: algos/system/memory.py), plus the step's [rows, tokens] tensors

  peak = resident + max(rollout, update)

The estimate has every row decode the whole budget (the worst case: rows that stop leave the cache).
--check runs whole steps (bench/grpo_step.py's "ours") on the cells it names and prints their measured
peak RSS next to the estimate; those rows stop where the model ends its answer.

    python bench/memory.py [--models tiny default] [--rows 16 64 256] [--tokens 64 256 1024] [--check 16x64 64x64]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).parent


def measure_parts(model_dir: str, autocast: str | None, widths: list[int], micro_batch: int) -> dict:
    """resident GB, K/V bytes per token, the prompt width, and per completion width one micro-batch's saved GB."""
    import torch

    from algos.algorithms.grpo import GRPOConfig
    from algos.config import load_config
    from algos.model.loading import load_policy
    from algos.model.policy import completion_logprobs
    from algos.rollout import make_env
    from algos.system.memory import rss_gb, saved_bytes
    from algos.system.runtime import build_optimizer

    config = load_config(GRPOConfig, overrides={"model.path": model_dir})
    model, tokenizer = load_policy(model_dir, dtype=torch.float32)
    optimizer = build_optimizer(model, config.optim)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # AdamW's two moments exist from the first step on
    resident = rss_gb()
    env = make_env(config, tokenizer, num_envs=micro_batch, device=torch.device("cpu"))
    env.reset(seed=0, options={"group_size": micro_batch})
    text = model.config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    bytes_per = 2 if autocast else 4
    kv_per_token = text.num_hidden_layers * 2 * text.num_key_value_heads * head_dim * bytes_per
    activations = {}
    for width in widths:
        ids = torch.cat([env.prompt_ids, torch.randint(0, len(tokenizer), (micro_batch, width))], 1)
        mask = torch.cat([env.prompt_mask, torch.ones(micro_batch, width, dtype=torch.long)], 1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(autocast)):
            kept = saved_bytes(lambda ids=ids, mask=mask: completion_logprobs(
                model, ids, mask, env.prompt_width, vocab_size=len(tokenizer)), model.parameters())
        activations[width] = kept / 1024**3
    return {"resident_gb": resident, "kv_bytes_per_token": kv_per_token, "prompt_width": env.prompt_width,
            "vocab": model.config.vocab_size, "activations_gb": activations}


def estimate(parts: dict, rows: int, tokens: int) -> dict:
    rollout = (rows * (parts["prompt_width"] + tokens) * parts["kv_bytes_per_token"] + rows * parts["vocab"] * 4) / 1024**3
    per_row = rows * (parts["prompt_width"] + tokens) * 8 * 6 / 1024**3  # ids, masks, log-probs, advantages: a few [N, T]
    update = parts["activations_gb"][str(tokens)] + per_row
    return {"rollout_gb": rollout, "update_gb": update, "peak_gb": parts["resident_gb"] + max(rollout, update)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "default"])
    parser.add_argument("--rows", nargs="+", type=int, default=[16, 64, 256])
    parser.add_argument("--tokens", nargs="+", type=int, default=[64, 256, 1024])
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto")
    parser.add_argument("--check", nargs="*", default=[], help="ROWSxTOKENS cells to also run whole (e.g. 16x64)")
    parser.add_argument("--parts", help=argparse.SUPPRESS)  # a model directory: measure its parts, JSON out
    parser.add_argument("--autocast", help=argparse.SUPPRESS)
    args = parser.parse_args()

    from algos.config import PolicyLossConfig
    from algos.system.memory import fixed_micro_batch_rows

    micro_batch = fixed_micro_batch_rows(PolicyLossConfig().micro_batch_size)  # this bench runs on the CPU: "auto" is 8
    if args.parts:
        print(json.dumps(measure_parts(args.parts, args.autocast or None, args.tokens, micro_batch)))
        return
    sys.path.insert(0, str(BENCH))
    import torch
    from grpo_step import bench_autocast, tiny_model_dir

    from algos.model.loading import default_model_path
    from algos.system.hardware import describe_machine

    machine = describe_machine(torch.device("cpu"))
    print(f"machine: {machine['cpu']}, CPU capability {machine['cpu_capability']}, bf16 units "
          f"{'/'.join(machine['cpu_bf16_units']) or 'none'}, {machine['torch_threads']} threads")
    root = Path(tempfile.mkdtemp())
    for name in args.models:
        model_dir = tiny_model_dir(root) if name == "tiny" else str(default_model_path()) if name == "default" else name
        autocast, why = bench_autocast(argparse.Namespace(precision=args.precision), model_dir)
        out = subprocess.run([sys.executable, __file__, "--parts", model_dir, "--autocast", autocast or "",
                              "--tokens", *map(str, args.tokens)], capture_output=True, text=True, check=True)
        parts = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"\nmodel {name}: weights float32, matmuls {autocast or 'float32'} ({why}); micro-batch {micro_batch} rows; "
              f"resident (model + grads + AdamW + process) {parts['resident_gb']:.2f} GB; prompt {parts['prompt_width']} "
              f"tokens; K/V {parts['kv_bytes_per_token'] / 1024:.1f} KiB per token")
        print(f"  {'rows':>5} {'tokens':>6} {'rollout GB':>10} {'update GB':>9} {'peak GB':>8}  {'measured':>8}")
        for rows in args.rows:
            for tokens in args.tokens:
                cell = estimate(parts, rows, tokens)
                measured = ""
                if f"{rows}x{tokens}" in args.check:
                    run = subprocess.run([sys.executable, str(BENCH / "grpo_step.py"), "--only", "ours", "--model", model_dir,
                                          "--prompts", str(rows // 8), "--group-size", "8", "--new-tokens", str(tokens),
                                          "--autocast", autocast or ""],
                                         capture_output=True, text=True, check=True)
                    measured = f"{json.loads(run.stdout.strip().splitlines()[-1])['peak_rss_gb']:8.2f}"
                print(f"  {rows:5d} {tokens:6d} {cell['rollout_gb']:10.2f} {cell['update_gb']:9.2f} {cell['peak_gb']:8.2f}  "
                      f"{measured:>8}")


if __name__ == "__main__":
    main()
