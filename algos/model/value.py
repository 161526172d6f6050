"""PPO's critic: a scalar value per token from a transformer backbone.

Two layouts:

- ``"head"``: a Linear(H, 1) head on the policy's own backbone. One forward
  pass gives both log-probs and values; the value loss also trains the shared
  backbone (TRL's AutoModelForCausalLMWithValueHead layout). Cheapest in memory.
- ``"separate"``: a copy of the policy's backbone plus the head, trained on its
  own (InstructGPT/verl layout). Twice the weights, no weights shared between
  the two losses (gradient clipping is still joint), and its own learning rate.
  Under LoRA the copy's base stays frozen and the critic trains its own adapter.

Under LoRA, ``"head"`` is a value head on the policy's adapted backbone: the head trains in full and the value
loss reaches the backbone through the policy's adapter, as it reaches the full backbone without LoRA.

Values are read at the positions whose hidden state predicts each completion
token, so V[:, t] is the value of the state before completion token t.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from algos.model.attention import training_attention
from algos.model.policy import position_ids_from_mask

VALUE_MODEL_KINDS = ("head", "separate")


class ValueModel(nn.Module):
    """Backbone (shared with the policy or owned) -> last hidden state -> Linear(H, 1) in fp32 -> Float[B, L]."""

    def __init__(self, backbone: nn.Module, hidden_size: int, shares_policy_backbone: bool):
        super().__init__()
        self.shares_policy_backbone = shares_policy_backbone
        if shares_policy_backbone:
            # Not registered as a submodule: parameters() and state_dict() hold only what the
            # critic owns (the head), so the policy's weights are never optimised or saved twice.
            self.__dict__["backbone"] = backbone
        else:
            self.backbone = backbone
        # Zero init: V = 0 at start, so the first advantages are the plain rewards-to-go and the
        # shared backbone receives no value-loss gradient until the head has learned something.
        self.head = nn.Linear(hidden_size, 1, dtype=torch.float32)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def values_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float[B, T, H] hidden states -> Float[B, T] values (fp32)."""
        # Outside autocast: under bf16 autocast the head would round V to ~3 digits, coarser than the
        # per-token KL rewards, and GAE, returns and the value loss would all inherit bf16.
        with torch.autocast(hidden.device.type, enabled=False):
            return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Long[B, L], Long[B, L] -> Float[B, L, H] the backbone's last hidden state."""
        return last_hidden_states(self.backbone, input_ids, attention_mask)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Long[B, L], Long[B, L] -> Float[B, L] value at every position."""
        return self.values_from_hidden(self.hidden_states(input_ids, attention_mask))


def last_hidden_states(backbone: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Long[B, L], Long[B, L] -> Float[B, L, H]: one full forward of a transformer body, without a KV cache."""
    with training_attention(backbone, input_ids.device):
        return backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),  # left padding: count from the first real token
            use_cache=False,
        ).last_hidden_state


def policy_backbone(policy: nn.Module) -> nn.Module:
    """The transformer body of a transformers causal LM (everything but the LM head)."""
    backbone = policy.get_decoder() if hasattr(policy, "get_decoder") else None
    if backbone is None:
        backbone = getattr(policy, "base_model", None)
    if backbone is None or backbone is policy:
        raise ValueError(f"cannot find the backbone of {type(policy).__name__}: expected a transformers causal LM")
    return backbone


def build_value_model(policy: nn.Module, kind: str = "head") -> ValueModel:
    """A critic for ``policy``: a head on its backbone (``"head"``) or on a copy of it (``"separate"``)."""
    if kind not in VALUE_MODEL_KINDS:
        raise ValueError(f"value_model must be one of {VALUE_MODEL_KINDS}, got {kind!r}")
    backbone = policy_backbone(policy)
    hidden_size = policy.config.get_text_config().hidden_size
    if kind == "separate":
        lora = any(".lora_" in name for name, _ in backbone.named_parameters())
        backbone = copy.deepcopy(backbone)
        if not lora:  # a LoRA policy's copy keeps its base frozen: the critic trains its own copy of the adapter
            backbone.requires_grad_(True)
    value_model = ValueModel(backbone, hidden_size, shares_policy_backbone=kind == "head")
    return value_model.to(next(policy.parameters()).device)
