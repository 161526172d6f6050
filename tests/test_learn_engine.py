"""algos.learn.accumulate_and_step: the one accumulate-and-step loop of GRPO, PPO and the warm start."""

import math

import pytest
import torch

from algos.learn import accumulate_and_step

INPUTS = torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [-2.0, 1.0], [1.0, 1.0]])
TARGETS = torch.tensor([1.0, 0.0, 2.0, -1.0, 0.5])


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(2, 1)


def _step(model, micro, loss_of_rows, lr=0.1):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    return accumulate_and_step(micro, loss_of_rows, forward=model, device_type="cpu", modules=model, optimizer=optimizer,
                               scaler=scaler, max_grad_norm=0.0, world_size=1)


def _mean_squared_error(model):
    """The loss of ``rows``, normalised by the whole batch's count so the micro-batches' losses sum to the batch's."""

    def loss(rows):
        if rows is None:  # a zero-weight pass: part of the graph, no gradient
            return model(INPUTS[:1]).sum() * 0.0
        return ((model(INPUTS[rows]).squeeze(-1) - TARGETS[rows]) ** 2).sum() / len(TARGETS)

    return loss


def test_micro_batches_and_zero_weight_passes_step_as_one_batch():
    whole, split = _model(), _model()
    one = _step(whole, [slice(0, 5)], _mean_squared_error(whole))
    parts = _step(split, [slice(0, 2), slice(2, 5), None], _mean_squared_error(split))
    assert one.applied and parts.applied
    assert parts.loss == pytest.approx(one.loss) and parts.grad_norm == pytest.approx(one.grad_norm)
    for a, b in zip(whole.parameters(), split.parameters()):
        torch.testing.assert_close(a, b)
        assert b.grad is None  # cleared after the step


def test_hand_computed_loss_and_gradient():
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.constant_(model.weight, 2.0)
    x, y = torch.tensor([[1.0], [3.0]]), torch.tensor([1.0, 2.0])

    def loss(rows):
        return ((model(x[rows]).squeeze(-1) - y[rows]) ** 2).sum() / 2

    # residuals 1 and 4: loss (1 + 16) / 2 = 8.5; d/dw = (2*1*1 + 2*4*3) / 2 = 13; SGD lr 0.1 -> w = 2 - 1.3
    result = _step(model, [slice(0, 1), slice(1, 2)], loss)
    assert (result.loss, result.grad_norm, result.applied) == (8.5, 13.0, True)
    assert model.weight.item() == pytest.approx(0.7)


def test_a_non_finite_loss_skips_the_step_and_leaves_the_weights():
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    mse = _mean_squared_error(model)

    def poisoned(rows):
        loss = mse(rows)
        return loss * math.nan if rows == slice(2, 5) else loss

    result = _step(model, [slice(0, 2), slice(2, 5)], poisoned)
    assert not result.applied and math.isnan(result.loss)
    for a, b in zip(before, model.parameters()):
        assert torch.equal(a, b) and b.grad is None


def test_a_loss_that_is_not_finite_anywhere_skips_the_step_even_with_finite_gradients():
    """An inf that carries no gradient (a constant term): the gradients are finite, the flag alone must skip, and it
    must hold whichever micro-batch it came from."""
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    mse = _mean_squared_error(model)

    def first_inf(rows):
        return mse(rows) + (torch.tensor(math.inf) if rows == slice(0, 2) else 0.0)

    result = _step(model, [slice(0, 2), slice(2, 5)], first_inf)
    assert not result.applied and math.isnan(result.loss)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_each_loss_is_scaled_by_the_world_size_before_backward():
    """DDP and FSDP2 average gradients over ranks: times the world size, the sum of the ranks' losses."""
    one, two = torch.nn.Linear(1, 1, bias=False), torch.nn.Linear(1, 1, bias=False)
    for model in (one, two):
        torch.nn.init.constant_(model.weight, 2.0)
    x, y = torch.tensor([[1.0]]), torch.tensor([1.0])
    for model, world_size in ((one, 1), (two, 2)):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        accumulate_and_step([slice(0, 1)], lambda rows, m=model: ((m(x[rows]).squeeze(-1) - y[rows]) ** 2).sum(),
                            forward=model, device_type="cpu", modules=model, optimizer=optimizer,
                            scaler=torch.amp.GradScaler("cpu", enabled=False), max_grad_norm=0.0, world_size=world_size)
    # d/dw (w - 1)^2 at w = 2 is 2: one rank steps by 0.2, the doubled loss by 0.4
    assert one.weight.item() == pytest.approx(1.8) and two.weight.item() == pytest.approx(1.6)
