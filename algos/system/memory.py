"""Rows per forward/backward from a memory budget (loss.micro_batch_memory_gb, like verl's dynamic batch size):
the activations autograd keeps for backward, measured on the step's own rows with saved-tensor hooks, so one
budget holds on any model, precision and completion length."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

# loss.micro_batch_size = "auto": rows per forward on a CPU, where a larger micro-batch does not pay (8 rows trained
# 20.3 s, all 64 rows 28.8 s, on a 2-core Xeon: docs/performance.md); TRL's per_device_train_batch_size.
CPU_MICRO_BATCH_ROWS = 8
# ...and on a GPU, the share of the memory it has left that one forward's saved activations may take: backward's
# gradients of those activations, and the allocator's fragmentation, need the rest.
GPU_ACTIVATION_SHARE = 0.5


def fixed_micro_batch_rows(micro_batch_size: int | str) -> int:
    """loss.micro_batch_size where no memory probe sizes the passes (the warm start's few): "auto" is the CPU's rows."""
    return CPU_MICRO_BATCH_ROWS if micro_batch_size == "auto" else int(micro_batch_size)


def free_accelerator_bytes(device: torch.device) -> int | None:
    """Bytes torch can still take on ``device``: the driver's free memory plus what torch's caching allocator holds
    unused; None off CUDA (a CPU's micro-batch is not sized by memory, and other accelerators are not read)."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def rss_gb() -> float:
    """The process's resident memory now, in GiB (Linux: /proc/self/statm)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024**3


def saved_bytes(forward: Callable[[], Any], weights: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``forward`` runs, ``weights``' own left out
    (they exist whatever the rows); the forward's graph is dropped on return."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    resident = {weight.untyped_storage().data_ptr() for weight in weights}
    return sum(size for pointer, size in storages.items() if pointer not in resident)


@dataclass(frozen=True)
class ActivationCost:
    """What a forward keeps for backward: ``fixed_bytes`` whatever its rows (e.g. autocast's half-precision weight
    copies), plus ``row_bytes`` per row of the batch's width (its prompt included: the probe rows differ in it)."""

    fixed_bytes: int
    row_bytes: int

    def rows_within(self, budget_bytes: float, most: int) -> int:
        """The most rows, up to ``most``, whose activations fit ``budget_bytes``; at least 1 (a row cannot be split)."""
        fit = (budget_bytes - self.fixed_bytes) // max(self.row_bytes, 1)
        return int(min(most, max(1, fit)))


def activation_cost(forward_rows: Callable[[torch.Tensor], Any], prompt_ids: torch.Tensor,
                    weights: Iterable[torch.Tensor], row_tokens: torch.Tensor | None = None) -> ActivationCost:
    """Measure ``forward_rows(rows)`` (the loss's forward on those [k] row indices) on the longest row, and on it with
    the longest row of another prompt (a GRPO group shares its prompt's activations: rows from two groups count it
    per row), so the cost bounds the batch's rows. ``prompt_ids``: [N, P]; ``row_tokens``: [N] tokens per row
    (None: rows alike, the first ones are taken)."""
    weights = list(weights)
    lengths = (row_tokens if row_tokens is not None else torch.zeros(len(prompt_ids))).double()
    first = int(lengths.argmax())  # the first of equals
    others = (prompt_ids != prompt_ids[first]).any(-1)
    if not others.any():  # one group: the longest of the other rows
        others = torch.arange(len(prompt_ids), device=prompt_ids.device) != first
    one = saved_bytes(lambda: forward_rows(torch.tensor([first])), weights)
    if not others.any():  # a one-row batch
        return ActivationCost(fixed_bytes=0, row_bytes=one)
    second = int(lengths.masked_fill(~others.to(lengths.device), -1).argmax())
    two = saved_bytes(lambda: forward_rows(torch.tensor([first, second])), weights)
    row = max(two - one, 1)
    return ActivationCost(fixed_bytes=max(one - row, 0), row_bytes=row)
