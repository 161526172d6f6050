"""Rows per micro-batch, the same rule for every algorithm: at most loss.micro_batch_size ("auto": 8 on a CPU, the
whole batch on a GPU), and the most whose activations fit loss.micro_batch_memory_gb (on a GPU with "auto" and no
budget: a share of its free memory), measured on the batch's longest rows by the algorithm's own training forward."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from algos.config import PolicyLossConfig
from algos.system.distributed import sum_over_ranks, whole_weights
from algos.system.memory import (
    CPU_MICRO_BATCH_ROWS,
    GPU_ACTIVATION_SHARE,
    ActivationCost,
    activation_cost,
    free_accelerator_bytes,
)


class MicroBatchSizer:
    """Decides each update's rows per micro-batch for one trainer. The memory probe (``measure``) runs again only for
    a batch wider (prompt or total width) than any probed, since a narrower one costs no more per row."""

    def __init__(self, loss: PolicyLossConfig, device: torch.device, forward: torch.nn.Module) -> None:
        self.loss, self.device, self.forward = loss, device, forward
        # (prompt width, total width) of the probed batch, and what its rows cost
        self.probed: tuple[tuple[int, int], ActivationCost] | None = None

    def rows(self, num_rows: int | None, widths: tuple[int, int], measure: Callable[[], ActivationCost]) -> int:
        """Rows per micro-batch for a batch of ``num_rows`` on this rank (None: it has none) and ``widths`` (prompt,
        total; (0, 0) without rows). ``measure()`` runs the training forward's probe on the longest rows, under
        whole weights. Every rank calls it (an FSDP2 gather is voted over ranks)."""
        most, budget_gb = self.loss.micro_batch_size, self.loss.micro_batch_memory_gb
        if most == "auto":
            free = free_accelerator_bytes(self.device)
            if free is None:
                most = CPU_MICRO_BATCH_ROWS
            else:
                most = max(num_rows if num_rows is not None else 1, 1)
                budget_gb = budget_gb if budget_gb is not None else GPU_ACTIVATION_SHARE * free / 1024**3
        if budget_gb is None:
            return most
        wider = self.probed is None or any(w > seen for w, seen in zip(widths, self.probed[0]))
        if sum_over_ranks(float(wider))[0] > 0:  # whole_weights gathers FSDP2's shards: every rank enters, or none
            with whole_weights(self.forward):  # the probe runs the bare modules: their weights whole
                if num_rows is not None and wider:
                    with torch.enable_grad():  # what backward keeps, also when asked from a no-grad pass
                        self.probed = (widths, measure())
        if num_rows is None:
            return most
        return self.probed[1].rows_within(budget_gb * 1024**3, most=most)

    def batch_rows(self, batch: tuple[torch.Tensor, torch.Tensor, int] | None,
                   forward_rows: Callable[[torch.Tensor], Any], weights: Iterable[torch.Tensor]) -> int:
        """``rows`` for an update's ``batch``: its [N, P+T] ids and mask and its prompt width (None: this rank has no
        rows), probed by ``forward_rows(rows)``, the update's training forward of those row indices, on ``weights``.
        Every rank calls it."""
        if batch is None:
            return self.rows(None, (0, 0), measure=lambda: None)
        input_ids, attention_mask, prompt_width = batch
        return self.rows(input_ids.shape[0], (prompt_width, input_ids.shape[1]), measure=lambda: activation_cost(
            forward_rows, input_ids[:, :prompt_width], weights, attention_mask.sum(-1)))
