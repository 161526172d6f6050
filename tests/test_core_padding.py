"""algos/core/padding.py against hand-written tensors."""

from __future__ import annotations

import torch

from algos.core.padding import left_padded, right_pad_cat, right_padded


def test_left_padded_aligns_every_row_on_its_last_token():
    ids, mask = left_padded([[5, 6, 7], [8], []], pad_id=0, device="cpu")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert ids.dtype == mask.dtype == torch.long
    ids, mask = left_padded([[3, 4]], pad_id=9, device=torch.device("cpu"))
    assert ids.tolist() == [[3, 4]] and mask.tolist() == [[1, 1]]
    assert left_padded([[1], [2, 3]], pad_id=-1, device="cpu")[0].tolist() == [[-1, 1], [2, 3]]


def test_right_padded_fills_after_each_row_in_the_dtype_asked():
    values = right_padded([[0.5, -1.0], [2.0], [1.0, 2.0, 3.0]], fill=7.0, dtype=torch.float32, device="cpu")
    assert values.tolist() == [[0.5, -1.0, 7.0], [2.0, 7.0, 7.0], [1.0, 2.0, 3.0]] and values.dtype == torch.float32
    tokens = right_padded([[4], [5, 6]], fill=0, dtype=torch.long, device="cpu")
    assert tokens.tolist() == [[4, 0], [5, 6]] and tokens.dtype == torch.long


def test_right_pad_cat_stacks_parts_of_different_widths_zero_padded():
    parts = [torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0], [4.0]]), torch.tensor([[5.0, 6.0, 7.0]])]
    assert right_pad_cat(parts, 4).tolist() == [[1, 2, 0, 0], [3, 0, 0, 0], [4, 0, 0, 0], [5, 6, 7, 0]]
    masks = right_pad_cat([torch.tensor([[True]]), torch.tensor([[True, True]])], 2)
    assert masks.tolist() == [[True, False], [True, True]] and masks.dtype == torch.bool


def test_the_dtype_and_device_asked_are_the_ones_returned():
    """Not the ones torch would infer from the values: ints asked as floats, and every tensor on ``device``."""
    assert right_padded([[1], [2, 3]], fill=0, dtype=torch.float32, device="cpu").dtype == torch.float32
    ids, mask = left_padded([[1], [2, 3]], pad_id=0, device="meta")
    assert ids.device.type == mask.device.type == "meta"
    assert right_padded([[1.0]], fill=0.0, dtype=torch.float32, device="meta").device.type == "meta"
