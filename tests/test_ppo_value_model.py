import pytest
import torch

from algos.model.value import build_value_model
from rlvr_env.testing import build_char_tokenizer, build_tiny_model


@pytest.fixture(scope="module")
def policy_and_batch():
    tokenizer = build_char_tokenizer()
    policy = build_tiny_model(tokenizer)
    batch = tokenizer(["1+2=", "12+34="], return_tensors="pt", padding=True)
    return policy, batch


def test_head_shares_the_policy_backbone_and_owns_only_the_head(policy_and_batch):
    policy, batch = policy_and_batch
    critic = build_value_model(policy, "head")
    assert [name for name, _ in critic.named_parameters()] == ["head.weight", "head.bias"]
    assert set(critic.state_dict()) == {"head.weight", "head.bias"}
    values = critic(batch.input_ids, batch.attention_mask)
    assert values.shape == batch.input_ids.shape and values.dtype == torch.float32
    assert (values == 0).all()  # zero-initialised head
    # The value loss reaches the shared backbone once the head is non-zero.
    torch.nn.init.normal_(critic.head.weight)
    critic(batch.input_ids, batch.attention_mask).sum().backward()
    assert policy.model.layers[0].self_attn.q_proj.weight.grad is not None
    policy.zero_grad(set_to_none=True)


def test_separate_critic_is_a_copy_that_trains_alone(policy_and_batch):
    policy, batch = policy_and_batch
    critic = build_value_model(policy, "separate")
    policy_params = {id(p) for p in policy.parameters()}
    assert not policy_params & {id(p) for p in critic.parameters()}
    # Same backbone weights at start: identical hidden states.
    torch.testing.assert_close(
        critic.hidden_states(batch.input_ids, batch.attention_mask),
        build_value_model(policy, "head").hidden_states(batch.input_ids, batch.attention_mask),
    )
    torch.nn.init.normal_(critic.head.weight)
    before = [p.detach().clone() for p in policy.parameters()]
    optimizer = torch.optim.SGD(critic.parameters(), lr=0.1)
    critic(batch.input_ids, batch.attention_mask).square().mean().backward()
    optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))
    assert all(p.grad is None for p in policy.parameters())


def test_unknown_kind_is_rejected(policy_and_batch):
    with pytest.raises(ValueError, match="value_model"):
        build_value_model(policy_and_batch[0], "shared-ish")


@pytest.mark.parametrize("kind", ["head", "separate"])
def test_values_stay_fp32_under_bf16_autocast(policy_and_batch, kind):
    """Under bf16 autocast the head ran in bf16: V rounded to ~3 digits (coarser than per-token KL
    rewards), and GAE, returns and the value loss inherited bf16."""
    policy, batch = policy_and_batch
    critic = build_value_model(policy, kind)
    torch.nn.init.normal_(critic.head.weight)
    hidden = critic.hidden_states(batch.input_ids, batch.attention_mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        values = critic.values_from_hidden(hidden)
    assert values.dtype == torch.float32
    torch.testing.assert_close(values, critic.values_from_hidden(hidden))  # the fp32 result, exactly
