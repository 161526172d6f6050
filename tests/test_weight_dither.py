"""model.dither_weights (algos/model/dither.py): fp32 master weights loaded from a bf16 checkpoint lie on bf16's grid,
so a bf16 forward misses every update smaller than half a grid step; moved inside half a step, they change no forward
and the bf16 forwards follow small updates."""

from __future__ import annotations

import json

import pytest
import torch

from algos.algorithms.grpo import GRPOConfig, GRPOTrainer
from algos.config import load_config
from algos.model.dither import dither_to_grid, grid_spacing
from rlvr_env.testing import build_char_tokenizer, build_tiny_model

TASK = '{"digits": 1, "terms": 2, "operators": "+", "prompt_template": "{expression}=", "format_weight": 0.0}'


def model_on_grid(dtype=torch.bfloat16, seed=0):
    """The tiny model with its weights rounded to ``dtype`` and kept in fp32: a half-precision checkpoint loaded."""
    model = build_tiny_model(build_char_tokenizer(), hidden_size=64, num_layers=2, seed=seed)
    with torch.no_grad():
        for weight in model.parameters():
            weight.copy_(weight.to(dtype).float())
    return model


def test_grid_spacing_is_the_distance_to_the_nearer_neighbouring_value():
    weights = torch.tensor([1.0, 1.5, -3.0, 0.02, -0.7, 2.0 ** -20, 0.0])
    for dtype in (torch.bfloat16, torch.float16):
        on_grid = weights.to(dtype)
        up = torch.nextafter(on_grid, torch.tensor(float("inf"), dtype=dtype)).float() - on_grid.float()
        down = on_grid.float() - torch.nextafter(on_grid, torch.tensor(float("-inf"), dtype=dtype)).float()
        nearer, spacing = torch.minimum(up, down), grid_spacing(on_grid.float(), dtype)
        normal = on_grid.float().abs() >= torch.finfo(dtype).tiny
        assert torch.equal(spacing[normal], nearer[normal])  # 1.0 and 2**-20: the finer side below
        assert (spacing <= nearer).all() and spacing[-1] == 0  # fp16's subnormals: finer than theirs (safe); 0 at 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_dither_changes_no_half_precision_value_and_moves_only_matrix_weights_on_the_grid(dtype):
    model = model_on_grid(dtype)
    off_grid = model.model.layers[0].mlp.up_proj.weight
    with torch.no_grad():
        off_grid.add_(grid_spacing(off_grid, dtype) / 3)  # a weight between grid values is dithered already
    before = {name: weight.detach().clone() for name, weight in model.named_parameters()}
    rng_before = torch.get_rng_state()
    moved, total = dither_to_grid(model, dtype, seed=3)
    assert torch.equal(torch.get_rng_state(), rng_before)  # its own generator: a resumed run's draws stay the same
    matrices = {name for name, weight in model.named_parameters() if weight.dim() == 2}
    assert total == sum(before[name].numel() for name in matrices)
    assert moved == total - off_grid.numel() - sum(int((before[name] == 0).sum()) for name in matrices)
    for name, weight in model.named_parameters():
        assert torch.equal(weight.to(dtype), before[name].to(dtype)), name  # every half-precision forward is the same
        if weight.dim() < 2 or weight is off_grid:
            assert torch.equal(weight, before[name]), name
        else:
            step = (weight - before[name]).abs()
            inside = (step < grid_spacing(before[name], dtype) / 2) | (before[name] == 0)
            assert inside.all() and (step[before[name] != 0] > 0).float().mean() > 0.999, name
    again = model_on_grid(dtype)
    with torch.no_grad():
        again.model.layers[0].mlp.up_proj.weight.add_(grid_spacing(again.model.layers[0].mlp.up_proj.weight, dtype) / 3)
    dither_to_grid(again, dtype, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))  # seeded


def test_a_bf16_forward_sees_a_step_smaller_than_half_a_grid_step_once_dithered():
    """A sign-of-gradient step (AdamW's first) of 0.3 grid steps on every Linear weight (those autocast casts; an
    embedding lookup reads fp32): the bf16 forward of the weights as loaded computes the loss it computed before, to
    the bit; dithered, it sees the fp32 forward's drop."""
    ids = torch.randint(3, 30, (8, 16), generator=torch.Generator().manual_seed(0))

    def loss(model, bf16: bool) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return model(input_ids=ids, labels=ids).loss.float()

    def loss_drop(dither: bool, bf16: bool) -> float:
        model = model_on_grid()
        if dither:
            dither_to_grid(model, torch.bfloat16, seed=0)
        before = loss(model, bf16)
        model.zero_grad()
        loss(model, bf16=False).backward()
        with torch.no_grad():
            for module in model.modules():
                if not isinstance(module, torch.nn.Linear) or module.weight is model.get_input_embeddings().weight:
                    continue  # a tied LM head's weight is also the embedding's
                weight = module.weight
                weight.sub_(0.3 * grid_spacing(weight.to(torch.bfloat16).float(), torch.bfloat16) * weight.grad.sign())
            return (before - loss(model, bf16)).item()

    exact = loss_drop(dither=False, bf16=False)
    assert exact > 0
    assert loss_drop(dither=False, bf16=True) == 0.0  # every weight rounds back to where it was
    assert loss_drop(dither=True, bf16=True) == pytest.approx(exact, rel=0.3)


@pytest.mark.parametrize("dither", [True, False])
def test_a_bf16_run_dithers_its_policy_and_says_so(tmp_path, caplog, dither):
    directory = tmp_path / "model"
    model_on_grid().save_pretrained(directory)
    build_char_tokenizer().save_pretrained(directory)
    overrides = {
        "model.path": str(directory), "model.autocast": "bfloat16", "model.dither_weights": str(dither).lower(),
        "env.kwargs": TASK, "env.use_chat_template": "false", "env.max_new_tokens": "2",
        "run.output_dir": str(tmp_path / "run"), "run.progress": "false", "run.tensorboard": "false",
        "rollout.prompts_per_step": "2", "rollout.group_size": "2",
    }
    with caplog.at_level("INFO", logger="rlvr"):
        trainer = GRPOTrainer(load_config(GRPOConfig, overrides=overrides))
    loaded = model_on_grid()
    policy = trainer.run.model
    same = [torch.equal(mine, theirs) for mine, theirs in zip(policy.parameters(), loaded.parameters())]
    assert all(torch.equal(mine.to(torch.bfloat16), theirs.to(torch.bfloat16))
               for mine, theirs in zip(policy.parameters(), loaded.parameters()))
    machine = json.loads((tmp_path / "run" / "machine.json").read_text())
    if dither:
        assert not all(same) and machine["dithered_weights"] > 0
        assert "lay on bfloat16's grid, moved inside half a grid step" in caplog.text
    else:
        assert all(same) and "dithered_weights" not in machine
