"""Per-token KL estimators between the policy and a reference (Schulman's k1, k2, k3)."""

from __future__ import annotations

import torch

ESTIMATORS = ("k1", "k2", "k3")
LOG_RATIO_BOUND = 20.0  # |log pi_ref/pi| inside exp(): e^20 ~ 5e8 is finite in fp32


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3", clamp: float = 10.0) -> torch.Tensor:
    """[B, T] log pi, [B, T] log pi_ref -> [B, T] per-token KL(pi || pi_ref) estimate, clamped to [-clamp, clamp].

    k1 = log(pi/pi_ref); k2 = 0.5 * log(pi/pi_ref)^2; k3 = pi_ref/pi - log(pi_ref/pi) - 1 (unbiased, >= 0).
    The clamp keeps one wildly off-policy token from producing inf (verl clamps at 10 too).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"KL estimator must be one of {ESTIMATORS}, got {estimator!r}")
    log_ratio = logp.float() - ref_logp.float()
    if estimator == "k1":
        kl = log_ratio
    elif estimator == "k2":
        kl = 0.5 * log_ratio.square()
    else:
        # exp() kept finite as verl does; bounding it at +-clamp instead would stop k3 near clamp - 1
        log_ref_over_pi = (-log_ratio).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        kl = log_ref_over_pi.exp() - log_ref_over_pi - 1
    return kl.clamp(-clamp, clamp)
