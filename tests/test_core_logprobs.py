import math

import pytest
import torch

from algos.core.logprobs import LogitTransform, logprobs_from_hidden, logprobs_from_logits
from rlvr_env.testing import available_devices


def test_logprob_and_entropy_match_hand_computed_values():
    # logits [0, ln 3] at temperature 1 -> probs [1/4, 3/4].
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    logp, entropy = logprobs_from_logits(logits, torch.tensor([[1]]))
    assert logp.item() == pytest.approx(math.log(0.75))
    assert entropy.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))


def test_temperature_divides_logits():
    # logits [0, 2 ln 3] at temperature 2 -> same [1/4, 3/4].
    logits = torch.tensor([[[0.0, 2 * math.log(3.0)]]])
    logp, _ = logprobs_from_logits(logits, torch.tensor([[0]]), temperature=2.0)
    assert logp.item() == pytest.approx(math.log(0.25))


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 1000])
def test_chunked_hidden_path_equals_full_log_softmax_values_and_grads(chunk_size):
    torch.manual_seed(0)
    hidden = torch.randn(3, 5, 8, requires_grad=True)
    weight = torch.randn(11, 8, requires_grad=True)
    tokens = torch.randint(0, 11, (3, 5))
    logp, entropy = logprobs_from_hidden(hidden, weight, tokens, temperature=0.7, chunk_size=chunk_size)
    full = torch.log_softmax((hidden @ weight.T) / 0.7, dim=-1)
    expected = full.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logp, expected)
    torch.testing.assert_close(entropy, -(full.exp() * full).sum(-1))
    grads = torch.autograd.grad(logp.sum() + entropy.sum(), (hidden, weight))
    expected_grads = torch.autograd.grad(expected.sum() - (full.exp() * full).sum(), (hidden, weight))
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want)



def test_logit_transform_scales_then_softcaps_by_hand():
    # [0, 4] x 0.5 = [0, 2]; softcap 2: [0, 2 tanh(1)] = [0, 1.5232]; at temperature 1 p(1) = 1 / (1 + e^-1.5232).
    transform = LogitTransform(scale=0.5, softcap=2.0)
    torch.testing.assert_close(transform(torch.tensor([0.0, 4.0])), torch.tensor([0.0, 2 * math.tanh(1.0)]))
    hidden, weight = torch.tensor([[[1.0]]]), torch.tensor([[0.0], [4.0]])
    logp, _ = logprobs_from_hidden(hidden, weight, torch.tensor([[1]]), transform=transform)
    assert logp.item() == pytest.approx(-math.log1p(math.exp(-2 * math.tanh(1.0))))
    assert LogitTransform()(weight).equal(weight)  # the default is the identity

def test_bf16_logits_are_upcast_per_chunk():
    logits = torch.randn(2, 4, 9).to(torch.bfloat16)
    tokens = torch.randint(0, 9, (2, 4))
    logp, _ = logprobs_from_logits(logits, tokens, chunk_size=3)
    assert logp.dtype == torch.float32
    expected = torch.log_softmax(logits.float(), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logp, expected)


def test_bad_shapes_and_temperature_are_named():
    with pytest.raises(ValueError, match="disagree"):
        logprobs_from_logits(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        logprobs_from_logits(torch.zeros(1, 1, 4), torch.zeros(1, 1, dtype=torch.long), temperature=0.0)


def _reference(hidden, weight, tokens, temperature, transform):
    """The plain computation: full logits (at least fp32 past the matmul), autograd through everything."""
    logits = hidden @ weight.T
    full = torch.log_softmax(transform(logits.to(torch.promote_types(logits.dtype, torch.float32))) / temperature, dim=-1)
    return full.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), -(full.exp() * full).sum(-1)


@pytest.mark.parametrize("transform", [LogitTransform(), LogitTransform(scale=0.5, softcap=3.0)])
@pytest.mark.parametrize("uses", ["both", "log-prob only", "entropy only"])
@pytest.mark.parametrize("device", available_devices())
def test_hidden_path_gradients_match_autograd_for_any_upstream_gradient(transform, uses, device):
    # Random weights on each output, as a loss combining ratio terms and an entropy bonus would give.
    torch.manual_seed(1)
    options = {"dtype": torch.float64, "device": device}
    hidden = torch.randn(2, 7, 6, **options, requires_grad=True)
    weight = torch.randn(13, 6, **options, requires_grad=True)
    tokens = torch.randint(0, 13, (2, 7), device=device)
    upstream_logp, upstream_entropy = torch.randn(2, 7, **options), torch.randn(2, 7, **options)

    def loss(logp, entropy):
        terms = {"both": [logp * upstream_logp, entropy * upstream_entropy],
                 "log-prob only": [logp * upstream_logp], "entropy only": [entropy * upstream_entropy]}[uses]
        return sum(term.sum() for term in terms)

    got = torch.autograd.grad(loss(*logprobs_from_hidden(hidden, weight, tokens, 0.8, 3, transform)), (hidden, weight))
    want = torch.autograd.grad(loss(*_reference(hidden, weight, tokens, 0.8, transform)), (hidden, weight))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_hidden_path_passes_gradcheck():
    torch.manual_seed(2)
    hidden = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, 9, (5,))
    transform = LogitTransform(scale=1.5, softcap=2.0)
    assert torch.autograd.gradcheck(lambda h, w: logprobs_from_hidden(h, w, tokens, 0.7, 2, transform), (hidden, weight))


def test_only_the_wanted_gradients_are_computed():
    tokens = torch.tensor([[1, 2]])
    for hidden_grad, weight_grad in [(True, False), (False, True)]:
        hidden = torch.randn(1, 2, 4, requires_grad=hidden_grad)
        weight = torch.randn(5, 4, requires_grad=weight_grad)
        logp, _ = logprobs_from_hidden(hidden, weight, tokens)
        logp.sum().backward()
        assert (hidden.grad is not None) == hidden_grad and (weight.grad is not None) == weight_grad


def _saved_shapes(hidden, weight, tokens, **options) -> list[tuple[int, ...]]:
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        logprobs_from_hidden(hidden, weight, tokens, **options)
    return saved


def test_no_vocabulary_wide_tensor_is_kept_for_backward_without_a_budget_or_a_gradient():
    vocab, rows = 97, 10
    hidden = torch.randn(rows, 8, requires_grad=True)
    weight = torch.randn(vocab, 8, requires_grad=True)
    tokens = torch.randint(0, vocab, (rows,))
    saved = _saved_shapes(hidden, weight, tokens, chunk_size=4, keep_bytes=0)
    assert saved and all(shape in {(rows, 8), (vocab, 8), (rows,)} for shape in saved), saved
    with torch.no_grad():  # nothing to keep them for, whatever the budget
        assert _saved_shapes(hidden, weight, tokens, chunk_size=4) == []


def test_logits_are_kept_only_for_a_backward_that_will_run(monkeypatch):
    import algos.core.logprobs as logprobs_module

    budgets = []
    real_apply = logprobs_module._LinearLogprobs.apply
    monkeypatch.setattr(logprobs_module._LinearLogprobs, "apply", lambda *args: budgets.append(args[-1]) or real_apply(*args))
    tokens = torch.tensor([[1, 2]])
    for grad_enabled, hidden_grad, weight_grad, kept in [(True, True, False, True), (True, False, True, True),
                                                         (True, False, False, False), (False, True, True, False)]:
        budgets.clear()
        hidden = torch.randn(1, 2, 4, requires_grad=hidden_grad)
        weight = torch.randn(5, 4, requires_grad=weight_grad)
        with torch.set_grad_enabled(grad_enabled):
            logprobs_from_hidden(hidden, weight, tokens, keep_bytes=1000)
        assert budgets == [1000 if kept else 0]


@pytest.mark.parametrize("autocast", [False, True])
def test_chunks_kept_within_the_budget_give_backward_the_same_gradients(autocast, monkeypatch):
    torch.manual_seed(4)
    vocab, rows = 97, 10
    hidden = torch.randn(rows, 8, requires_grad=True)
    weight = torch.randn(vocab, 8, requires_grad=True)
    tokens = torch.randint(0, vocab, (rows,))
    chunk_bytes = 4 * vocab * (2 if autocast else 4)  # a 4-row chunk's raw logits in the matmul dtype
    products = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda *args, **kwargs: products.append(args[0].shape[0]) or real_mm(*args, **kwargs))

    def run(keep_bytes):
        products.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logp, entropy = logprobs_from_hidden(hidden, weight, tokens, 0.7, 4, LogitTransform(2.0, 3.0), keep_bytes)
        grads = torch.autograd.grad(logp.sum() + 0.3 * entropy.sum(), (hidden, weight))
        return (logp, entropy, *grads), products.count(4) + products.count(2)  # logits chunks: 4, 4 and 2 rows

    want, recomputed_all = run(0)
    assert recomputed_all == 6  # three chunks in forward, again in backward
    # 1.5 chunks' bytes: the first chunk, then not the second, nor the shorter last one that would still fit.
    for keep_bytes, kept in [(chunk_bytes, 1), (chunk_bytes * 3 // 2, 1), (2 * chunk_bytes + 1, 2), (10**9, 3)]:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            saved = _saved_shapes(hidden, weight, tokens, chunk_size=4, keep_bytes=keep_bytes)
        assert saved.count((4, vocab)) + saved.count((2, vocab)) == kept
        got, products_made = run(keep_bytes)
        assert products_made == 6 - kept
        for g, w in zip(got, want):
            assert torch.equal(g, w)  # the kept logits are bitwise the recomputed ones


@pytest.mark.parametrize("device", available_devices())
def test_bf16_autocast_runs_the_head_in_bf16_and_returns_fp32(device):
    torch.manual_seed(3)
    hidden = torch.randn(6, 16, device=device, requires_grad=True)
    weight = torch.randn(21, 16, device=device, requires_grad=True)
    tokens = torch.randint(0, 21, (6,), device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        logp, entropy = logprobs_from_hidden(hidden, weight, tokens, chunk_size=4)
        want_logp, want_entropy = _reference(hidden, weight, tokens, 1.0, LogitTransform())  # autocast's bf16 matmul
    assert logp.dtype == entropy.dtype == torch.float32
    torch.testing.assert_close(logp, want_logp)
    torch.testing.assert_close(entropy, want_entropy)
    got = torch.autograd.grad(logp.sum(), (hidden, weight))
    want = torch.autograd.grad(want_logp.sum(), (hidden, weight))
    for g, w in zip(got, want):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, w, atol=2e-2, rtol=2e-2)  # bf16 products of the gradient, as autograd's


def test_logit_chunks_are_recomputed_in_backward_only_when_a_gradient_is_needed(monkeypatch):
    import algos.core.logprobs as logprobs_module

    calls = []
    real = logprobs_module.checkpoint
    monkeypatch.setattr(logprobs_module, "checkpoint", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    tokens = torch.tensor([[1, 2, 0]])
    for requires_grad, grad_enabled, expected in [(True, True, 2), (True, False, 0), (False, True, 0)]:
        calls.clear()
        logits = torch.randn(1, 3, 5, requires_grad=requires_grad)
        with torch.set_grad_enabled(grad_enabled):
            logp, _ = logprobs_from_logits(logits, tokens, chunk_size=2)
        assert len(calls) == expected and logp.requires_grad == (requires_grad and grad_enabled)
        torch.testing.assert_close(logp, torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1))


def test_no_completion_tokens_give_empty_fp32_results():
    logp, entropy = logprobs_from_hidden(torch.zeros(2, 0, 4), torch.zeros(5, 4), torch.zeros(2, 0, dtype=torch.long))
    assert logp.shape == entropy.shape == (2, 0) and logp.dtype == entropy.dtype == torch.float32


def test_shape_and_chunk_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match=r"hidden \(1, 3, 4\) and tokens \(1, 2\) disagree on \[B, T\]"):
        logprobs_from_hidden(torch.zeros(1, 3, 4), torch.zeros(5, 4), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk_size must be >= 1, got 0"):
        logprobs_from_hidden(torch.zeros(1, 2, 4), torch.zeros(5, 4), torch.zeros(1, 2, dtype=torch.long), chunk_size=0)


def test_logit_scale_of_two_is_applied():
    torch.testing.assert_close(LogitTransform(scale=2.0)(torch.tensor([1.5])), torch.tensor([3.0]))
