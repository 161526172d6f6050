import pytest
import torch

from algos.core.aggregation import LOSS_AGGREGATIONS, aggregate_loss
from algos.core.policy_loss import clipped_policy_loss

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def test_modes_by_hand():
    assert aggregate_loss(LOSS, MASK, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm").item() == pytest.approx((6 / 3 + 4 / 3) / 2)
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", token_budget=10).item() == pytest.approx(0.5)


def test_empty_rows_do_not_count_as_sequences():
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]])
    assert aggregate_loss(LOSS, mask, "seq-mean-token-mean").item() == pytest.approx(2.0)


def test_unknown_mode_is_named():
    with pytest.raises(ValueError, match="token-sum"):
        aggregate_loss(LOSS, MASK, "token-sum")


@pytest.mark.parametrize("mode", LOSS_AGGREGATIONS.names)
def test_gradient_accumulation_over_uneven_micro_batches_equals_full_batch(mode):
    torch.manual_seed(0)
    rows, width = 7, 6
    logp = torch.randn(rows, width, dtype=torch.float64, requires_grad=True)
    old = (logp.detach() + 0.3 * torch.randn(rows, width, dtype=torch.float64))
    adv = torch.randn(rows, dtype=torch.float64)
    lengths = torch.tensor([6, 1, 3, 5, 2, 6, 4])
    mask = (torch.arange(width) < lengths.unsqueeze(-1)).to(torch.float64)

    def loss_of(sl, **norm):
        out = clipped_policy_loss(logp[sl], old[sl], adv[sl], mask[sl], eps_low=0.2, eps_high=0.28)
        return aggregate_loss(out.per_token_loss, mask[sl], mode, token_budget=width, **norm)

    full = loss_of(slice(0, rows))
    (full_grad,) = torch.autograd.grad(full, logp)

    norm = {"global_num_tokens": mask.sum().item(), "global_num_seqs": rows}
    accumulated, acc_grad = 0.0, torch.zeros_like(logp)
    for sl in (slice(0, 1), slice(1, 5), slice(5, 7)):  # micro-batches of 1, 4 and 2 rows
        micro = loss_of(sl, **norm)
        accumulated += micro.item()
        acc_grad += torch.autograd.grad(micro, logp)[0]
    assert accumulated == pytest.approx(full.item(), rel=1e-12)
    torch.testing.assert_close(acc_grad, full_grad, rtol=1e-12, atol=1e-14)


def test_token_mean_is_the_default_and_one_token_divides_by_one():
    assert aggregate_loss(LOSS, MASK).item() == pytest.approx(10 / 4)
    assert aggregate_loss(torch.tensor([[3.0, 5.0]]), torch.tensor([[1, 0]])).item() == 3.0


def test_masked_mean_of_a_single_entry_is_that_entry():
    from algos.core.aggregation import masked_mean

    assert masked_mean(torch.tensor([[3.0, 7.0]]), torch.tensor([[0, 1]])).item() == 7.0
