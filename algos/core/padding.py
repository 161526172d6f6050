"""Rows of different lengths as one tensor: token lists padded on the left (prompts, so every row's last column is
its newest token) or on the right (completions, masks, values), and [n_k, T_k] parts concatenated to one width."""

from __future__ import annotations

import torch


def left_padded(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id lists -> ([n, W] ids padded with ``pad_id`` on the left, [n, W] mask of the real tokens)."""
    width = max(len(ids) for ids in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, tokens in enumerate(rows):
        if tokens:
            ids[row, width - len(tokens) :] = torch.tensor(tokens, dtype=torch.long)
            mask[row, width - len(tokens) :] = 1
    return ids.to(device), mask.to(device)


def right_padded(rows: list[list], fill, dtype, device) -> torch.Tensor:
    """Lists of values -> [n, W] tensor of them, each filled with ``fill`` on the right."""
    width = max(len(values) for values in rows)
    return torch.tensor([values + [fill] * (width - len(values)) for values in rows], dtype=dtype, device=device)


def right_pad_cat(parts: list[torch.Tensor], width: int) -> torch.Tensor:
    """[n_k, T_k] parts -> [sum n_k, width], zero-padded on the right."""
    return torch.cat([torch.nn.functional.pad(part, (0, width - part.shape[1])) for part in parts])
