"""How much of a training run's update a bf16 forward sees: the weights as loaded and as dithered (model.dither_weights).

Under bf16 autocast every matmul rounds the fp32 master weights to bf16. A checkpoint published in bf16 loads exactly
on that grid, so the bf16 forwards see an update only where it has grown past half a grid step. Given the model a run
started from (--base) and the one it ended with (--trained), this prints the update's size in grid steps, the share
of weights whose bf16 value changed, the cosine and norm ratio between the update the bf16 forwards see and the one
the optimizer made, and the part of the update it carries; then the same with the base dithered inside half a step
(algos/model/dither.py) and the same update added: what a run with model.dither_weights would have seen.

    python bench/bf16_update_seen.py --base default --trained runs/demo/checkpoint-16/model
"""

from __future__ import annotations

import argparse
import statistics

import torch

from algos.model.dither import dither_to_grid, grid_spacing
from algos.model.loading import default_model_path, load_policy


def update_seen(base: dict[str, torch.Tensor], trained: dict[str, torch.Tensor]) -> dict[str, float]:
    """Over the matrix weights (those autocast casts): the update in grid steps, the share of bf16 values it changed,
    and per weight matrix (medians) the cosine and norm ratio of the bf16-seen update to the update, and the part of
    the update the seen one carries: its projection on the update over the update's squared norm (1 = all of it, on
    average; noise orthogonal to the update averages out in the matmuls' sums)."""
    steps, changed, total, cosines, ratios, carried = [], 0, 0, [], [], []
    for name, start in base.items():
        if start.dim() < 2:
            continue
        update = trained[name] - start
        seen = trained[name].to(torch.bfloat16).float() - start.to(torch.bfloat16).float()
        spacing = grid_spacing(start.to(torch.bfloat16).float(), torch.bfloat16)
        steps.append((update.abs() / spacing.clamp(min=1e-30)).flatten()[::97])  # a sample: quantiles of 134M are slow
        changed += int((seen != 0).sum())
        total += start.numel()
        if update.norm() > 0:
            cosines.append(torch.nn.functional.cosine_similarity(seen.flatten(), update.flatten(), dim=0).item())
            ratios.append((seen.norm() / update.norm()).item())
            carried.append(((seen * update).sum() / update.square().sum()).item())
    sample = torch.cat(steps)
    return {"median |update| / grid step": sample.median().item(), "p90": sample.quantile(0.9).item(),
            "bf16 values changed": changed / total, "cosine (median)": statistics.median(cosines),
            "norm ratio (median)": statistics.median(ratios), "update carried (median)": statistics.median(carried)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="default", help="the model the run started from ('default': SmolLM2)")
    parser.add_argument("--trained", required=True, help="the model it ended with (a checkpoint's model directory)")
    parser.add_argument("--seed", type=int, default=0, help="the dither's seed (run.seed)")
    args = parser.parse_args()
    base_path = str(default_model_path()) if args.base == "default" else args.base
    base, _ = load_policy(base_path, dtype=torch.float32, device="cpu")
    trained, _ = load_policy(args.trained, dtype=torch.float32, device="cpu")
    start = {name: weight.detach().clone() for name, weight in base.named_parameters()}
    end = {name: weight.detach() for name, weight in trained.named_parameters()}
    on_grid = sum(int((w.to(torch.bfloat16).float() == w).sum()) for w in start.values() if w.dim() == 2)
    print(f"base: {on_grid / sum(w.numel() for w in start.values() if w.dim() == 2):.4f} of its matrix weights on "
          f"bf16's grid")
    dither_to_grid(base, torch.bfloat16, seed=args.seed)
    dithered = {name: weight.detach() for name, weight in base.named_parameters()}
    for label, begin in (("as loaded", start), ("dithered", dithered)):
        finish = {name: begin[name] + (end[name] - start[name]) for name in start}  # the run's own update
        print(f"{label:10s} " + ", ".join(f"{key} {value:.3f}" for key, value in update_seen(begin, finish).items()))


if __name__ == "__main__":
    main()
