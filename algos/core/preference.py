"""Preference losses over (chosen, rejected) pairs: DPO and the variants TRL's DPOConfig.loss_type names.

Each takes the pairs' sequence log-probs under the policy and the frozen reference, [N] each, and returns the
per-pair loss [N]. With h = (log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l)):

- "sigmoid" (DPO, Rafailov et al. 2023): -log sigmoid(beta h); with label smoothing eps (the conservative DPO of
  Mitchell 2023; TRL 1.16's sigmoid loss ignores its label_smoothing): -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h).
- "ipo" (Azar et al. 2023): (h - 1 / (2 beta))^2, on log-probs averaged over each completion's tokens (the
  paper's and TRL's form; the others sum them): ``uses_mean_logprobs``.
- "hinge" (SLiC, Zhao et al. 2023): relu(1 - beta h).

beta (log pi(y) - log ref(y)) is each completion's implicit reward: the rewards/chosen and rewards/rejected
metrics, whose difference is rewards/margins and whose sign rewards/accuracies.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from algos.core.variants import Registry

PREFERENCE_LOSSES = Registry("dpo.loss_type")
USES_MEAN_LOGPROBS = frozenset({"ipo"})  # loss types whose log-probs are per-token means, not sums


def preference_margin(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
                      ref_rejected: torch.Tensor) -> torch.Tensor:
    """[N] x 4 sequence log-probs -> [N] h = (pi_w - ref_w) - (pi_l - ref_l)."""
    return (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)


def sigmoid_loss(margin: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    """[N] h -> [N] -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h) (eps 0: DPO)."""
    return -(1 - label_smoothing) * F.logsigmoid(beta * margin) - label_smoothing * F.logsigmoid(-beta * margin)


def ipo_loss(margin: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    """[N] h (of mean log-probs) -> [N] (h - 1 / (2 beta))^2 (no smoothing: validation refuses it)."""
    return (margin - 1 / (2 * beta)) ** 2


def hinge_loss(margin: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    """[N] h -> [N] relu(1 - beta h) (no smoothing: validation refuses it)."""
    return torch.relu(1 - beta * margin)


PREFERENCE_LOSSES.register("sigmoid", sigmoid_loss)
PREFERENCE_LOSSES.register("ipo", ipo_loss)
PREFERENCE_LOSSES.register("hinge", hinge_loss)


def implicit_rewards(policy: torch.Tensor, ref: torch.Tensor, beta: float) -> torch.Tensor:
    """[N] sequence log-probs under the policy and the reference -> [N] beta (log pi(y) - log ref(y))."""
    return beta * (policy - ref).detach()
