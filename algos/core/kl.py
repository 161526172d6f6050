"""Per-token KL estimators between the policy and a reference (Schulman's k1, k2, k3).

Each is registered in KL_ESTIMATORS as a function of the per-token log-ratio log(pi / pi_ref).
"""

from __future__ import annotations

import torch

from algos.core.variants import Registry

KL_ESTIMATORS = Registry("KL estimator")
LOG_RATIO_BOUND = 20.0  # |log pi_ref/pi| inside exp(): e^20 ~ 5e8 is finite in fp32


def k1(log_ratio: torch.Tensor) -> torch.Tensor:
    """[B, T] log(pi/pi_ref) -> [B, T] k1 = log(pi/pi_ref) (unbiased, can be negative)."""
    return log_ratio


KL_ESTIMATORS.register("k1", k1)


def k2(log_ratio: torch.Tensor) -> torch.Tensor:
    """[B, T] log(pi/pi_ref) -> [B, T] k2 = 0.5 * log(pi/pi_ref)^2 (its gradient is the KL's)."""
    return 0.5 * log_ratio.square()


KL_ESTIMATORS.register("k2", k2)


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """[B, T] log(pi/pi_ref) -> [B, T] k3 = pi_ref/pi - log(pi_ref/pi) - 1 (unbiased, >= 0)."""
    # exp() kept finite as verl does; bounding it at +-clamp instead would stop k3 near clamp - 1
    log_ref_over_pi = (-log_ratio).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return log_ref_over_pi.exp() - log_ref_over_pi - 1


KL_ESTIMATORS.register("k3", k3)


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3", clamp: float = 10.0) -> torch.Tensor:
    """[B, T] log pi, [B, T] log pi_ref -> [B, T] KL_ESTIMATORS[estimator] estimate of KL(pi || pi_ref), clamped to
    [-clamp, clamp]: the clamp keeps one wildly off-policy token from producing inf (verl clamps at 10 too)."""
    return KL_ESTIMATORS[estimator](logp.float() - ref_logp.float()).clamp(-clamp, clamp)
