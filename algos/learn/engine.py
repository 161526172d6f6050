"""One optimizer step over a gradient accumulation, the same for every algorithm.

An algorithm's update decides what a micro-batch's loss is (GRPO's clipped surrogate plus KL, PPO's
policy and value losses, DPO's preference loss, the warm start's cross-entropy); everything around it is here, once:

- every rank runs as many forwards and backwards (a rank with fewer rows runs zero-weight passes,
  ``rows is None``), which DDP's and FSDP2's collectives need;
- DDP all-reduces only in the last backward, and under autocast each weight is cast once for the
  whole accumulation (``accumulation_passes``);
- each loss is scaled by the world size before backward, since DDP and FSDP2 average gradients over
  ranks (the losses are normalised by global counts, so the sum of the ranks' losses is the loss);
- a non-finite loss on any rank skips the step on every rank (backward still runs on each, so the
  collectives stay matched), and the guarded step skips non-finite gradients too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from algos.system.distributed import accumulation_passes, min_over_ranks, sum_over_ranks
from algos.system.runtime import guarded_optimizer_step


@dataclass(frozen=True)
class Accumulated:
    """One accumulation's outcome: ``loss``, the sum of every micro-batch's loss over all ranks (NaN when one
    was not finite); ``grad_norm`` before clipping; ``applied``, False when the step was skipped."""

    loss: float
    grad_norm: float
    applied: bool


def accumulate_and_step(
    micro: list[slice | None],
    micro_batch_loss: Callable[[slice | None], torch.Tensor],
    *,
    forward: torch.nn.Module,
    device_type: str,
    modules: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    max_grad_norm: float,
    world_size: int,
) -> Accumulated:
    """Backward ``micro_batch_loss(rows)`` for each of ``micro``'s micro-batches (``rows`` None: a zero-weight pass,
    whose returned loss must be 0 x something of the forward's graph), then one guarded optimizer step of
    ``modules``. ``forward`` is the wrapped training module (DDP's gradient sync), ``device_type`` where autocast
    runs. Every rank calls it."""
    total, finite = 0.0, True
    for rows in accumulation_passes(forward, micro, device_type):
        loss = micro_batch_loss(rows)
        if rows is None:
            loss.backward()
            continue
        # A non-finite loss still runs backward (every rank makes as many passes); the flag below skips the
        # step on every rank, so no NaN reaches the weights.
        finite &= bool(torch.isfinite(loss))
        scaler.scale(loss * world_size).backward()
        total += loss.item()
    finite = min_over_ranks(float(finite))[0] == 1.0
    outcome = guarded_optimizer_step(modules, optimizer, max_grad_norm, finite, scaler)
    return Accumulated(sum_over_ranks(total)[0] if finite else math.nan, outcome.grad_norm, outcome.applied)

