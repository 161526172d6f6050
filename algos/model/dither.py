"""fp32 master weights moved off the half-precision grid, so that the half-precision forwards see small updates.

A checkpoint published in bf16 (SmolLM2, Qwen, Llama, Gemma) loads into fp32 master weights that lie exactly on
bf16's grid. Under bf16 autocast every forward, rollouts and evaluation included, rounds them back to that grid, so
an update smaller than half a grid step changes nothing the model computes: after the demo's 16 steps at lr 1e-5 the
median weight had moved 0.045 of a step, 6% of the weights had a new bf16 value, and the update the bf16 forwards saw
carried 14% of the one the optimizer made (bench/bf16_update_seen.py; the held-out accuracy of that fp32-trained
model: 69.0% decoded in fp32, 51.5% in bf16).

``dither_to_grid`` moves each such weight by a fixed random amount inside half a grid step. No forward changes (each
weight still rounds to its published value), but from then on an update of a fraction f of a step gives a fraction
f of the weights their neighbouring bf16 value: the forwards see the update on average instead of not at all (98%
of it; the same model decoded in bf16: 68.5%; the bf16 demo: 69.0%, as fp32's). It costs nothing per step, unlike a
second matmul for the low bits.
"""

from __future__ import annotations

import torch


def grid_spacing(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Float[same]: the distance between neighbouring ``dtype`` values at each weight (at a power of two the finer,
    lower side's); 0 at 0."""
    mantissa, exponent = torch.frexp(weight)  # weight = mantissa * 2**exponent, 0.5 <= |mantissa| < 1
    # in [2**(e-1), 2**e) the spacing is eps * 2**(e-1) (eps: the spacing at 1)
    spacing = torch.ldexp(torch.full_like(weight, torch.finfo(dtype).eps), exponent - 1 - (mantissa.abs() == 0.5).int())
    return torch.where(weight == 0, torch.zeros_like(weight), spacing)


@torch.no_grad()
def dither_to_grid(model: torch.nn.Module, dtype: torch.dtype, seed: int) -> tuple[int, int]:
    """Move each trainable fp32 matrix weight of ``model`` that lies exactly on ``dtype``'s grid (the weights autocast
    casts) by a uniform random amount strictly inside half a grid step, drawn from ``seed`` alone (the global RNG is
    left as it was): its ``dtype`` value stays what it was. Returns (weights moved, trainable matrix weights)."""
    moved = total = 0
    for index, (_, weight) in enumerate(sorted(model.named_parameters())):
        if not weight.requires_grad or weight.dim() < 2 or weight.dtype != torch.float32:
            continue
        on_grid = (weight.to(dtype).float() == weight) & (weight != 0)  # 0 stays 0 (its spacing: subnormals)
        generator = torch.Generator(weight.device).manual_seed(seed * 100_003 + index)
        uniform = torch.rand(weight.shape, generator=generator, device=weight.device) - 0.5
        weight.add_(torch.where(on_grid, uniform * 0.998 * grid_spacing(weight, dtype), 0.0))  # 0.998: never a tie
        moved += int(on_grid.sum())
        total += weight.numel()
    return moved, total
