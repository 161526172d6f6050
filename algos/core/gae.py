"""PPO's critic-side math: per-token rewards, GAE, value loss and diagnostics.

Pure tensor functions (docs/formulas.md, "PPO-Clip on the token MDP"). ``mask`` is 1 on completion tokens
that count and 0 elsewhere; positions where it is 0 never influence a result,
whatever values, rewards or NaNs they hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algos.core.aggregation import masked_mean


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Float[B, T], Long[B, T] -> Float[] mean over mask; masked entries may hold NaN/inf."""
    return masked_mean(torch.where(mask.bool(), x, 0.0), mask)


def _masked_var(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Float[B, T], Long[B, T] -> Float[] Bessel-corrected variance over mask."""
    centered = torch.where(mask.bool(), x - _masked_mean(x, mask), 0.0)
    return centered.pow(2).sum() / (mask.to(x.dtype).sum() - 1.0).clamp(min=1.0)


def last_valid_index(mask: torch.Tensor) -> torch.Tensor:
    """Long[B, T] mask -> Long[B] index of each row's last 1 (-1 for an empty row)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, -1).amax(dim=1)


def token_rewards(
    mask: torch.Tensor,
    scores: torch.Tensor | None = None,
    *,
    process_rewards: torch.Tensor | None = None,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """mask Long[B, T], scores Float[B], process_rewards Float[B, T], kl Float[B, T] -> rewards Float[B, T].

    r_t = process_rewards_t - kl_coef * kl_t on every valid token, plus the
    sequence score on the row's last valid token (the KL goes into the reward
    for PPO, InstructGPT-style). Masked positions get 0.
    """
    valid = mask.bool()
    dtype = next((t.dtype for t in (scores, process_rewards, kl) if t is not None and t.is_floating_point()),
                 torch.float32)
    rewards = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    if process_rewards is not None:
        rewards = rewards + torch.where(valid, process_rewards.to(dtype), 0.0)
    if kl is not None and kl_coef != 0.0:
        rewards = rewards - kl_coef * torch.where(valid, kl.to(dtype), 0.0)
    if scores is not None:
        last = last_valid_index(mask)
        has_tokens = last >= 0
        rows = torch.arange(mask.shape[0], device=mask.device)[has_tokens]
        rewards = rewards.index_put((rows, last[has_tokens]), scores.to(dtype)[has_tokens], accumulate=True)
    return rewards


def gae_advantages(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """rewards Float[B, T], values Float[B, T], mask Long[B, T] -> (advantages, returns), each Float[B, T].

    delta_t = r_t + gamma * V_next - V_t ; A_t = delta_t + gamma * lam * A_next,
    where "next" is the next *valid* token of the row (masked tokens are skipped,
    so a hole in the mask is transparent) and V after the last valid token is 0
    (the episode ended). returns = A + V, computed before any whitening.
    Masked positions of both outputs are 0.
    """
    valid = mask.bool()
    # Sanitise first so garbage (even NaN/inf) at masked positions cannot leak into the recursion.
    values = torch.where(valid, values, 0.0)
    rewards = torch.where(valid, rewards, 0.0)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        is_valid = valid[:, t]
        advantages[:, t] = torch.where(is_valid, advantage, 0.0)
        next_value = torch.where(is_valid, values[:, t], next_value)
        next_advantage = torch.where(is_valid, advantage, next_advantage)
    returns = torch.where(valid, advantages + values, 0.0)
    return advantages, returns


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """x Float[B, T], mask Long[B, T] -> Float[B, T] scaled to unit variance over mask (and zero mean if shift_mean).

    Masked positions are 0 in the output.
    """
    mean = _masked_mean(x, mask)
    whitened = (x - mean) * torch.rsqrt(_masked_var(x, mask) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, 0.0)


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip_range: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """values, old_values, returns Float[B, T] -> (per-token loss Float[B, T], clipped Bool[B, T]).

    loss = 0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2);
    ``clipped`` marks tokens where the clipped term is the larger one (so the
    gradient is cut). ``clip_range=None`` gives the plain 0.5 * (V - R)^2.
    Aggregate the per-token loss with the core's aggregation over the mask.
    """
    unclipped = (values - returns).pow(2)
    if clip_range is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    clipped_values = old_values + (values - old_values).clamp(-clip_range, clip_range)
    clipped = (clipped_values - returns).pow(2)
    return 0.5 * torch.maximum(unclipped, clipped), clipped > unclipped


def value_clip_fraction(clipped: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """clipped Bool[B, T], mask Long[B, T] -> Float[] share of valid tokens whose value loss was clipped."""
    return _masked_mean(clipped.float(), mask)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """values, returns Float[B, T], mask Long[B, T] -> Float[] 1 - Var(R - V) / Var(R) over valid tokens.

    1 = the critic predicts returns perfectly, 0 = no better than a constant,
    negative = worse. NaN when the returns have no variance.
    """
    returns_var = _masked_var(returns, mask)
    if returns_var.item() == 0.0:
        return torch.tensor(float("nan"), dtype=returns.dtype, device=returns.device)
    return 1.0 - _masked_var(returns - values, mask) / returns_var


def masked_mean_std(x: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """Float[B, T], Long[B, T] -> (mean, std) over valid tokens as Python floats, for logging."""
    return _masked_mean(x, mask).item(), _masked_var(x, mask).sqrt().item()


@dataclass
class AdaptiveKLController:
    """KL coefficient of the per-token reward penalty: fixed, or adaptive (PPO-Penalty).

    Adaptive rule of Ziegler et al. 2019 ("Fine-Tuning LMs from Human
    Preferences"): coef *= 1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon, the step itself clipped
    to +-20% (past n_steps = 5 x horizon the factor would turn negative). ``target=None`` keeps it fixed.
    """

    coef: float
    target: float | None = None
    horizon: int = 10000

    def __post_init__(self) -> None:
        if self.coef < 0:
            raise ValueError(f"kl coef must be >= 0, got {self.coef}")
        if self.target is not None and self.target <= 0:
            raise ValueError(f"kl target must be > 0 (or None for a fixed coefficient), got {self.target}")
        if self.horizon <= 0:
            raise ValueError(f"kl horizon must be > 0, got {self.horizon}")

    def update(self, observed_kl: float, n_steps: int) -> float:
        """Adjust the coefficient after a batch whose mean per-sequence KL was observed_kl; returns the new coef."""
        if self.target is not None:
            proportional_error = min(max(observed_kl / self.target - 1.0, -0.2), 0.2)
            # At most 20% per update: Ziegler's factor 1 + e * n / horizon is negative (KL a bonus) once a batch's
            # n rows exceed 5 x horizon (512 rows with horizon 100).
            self.coef *= 1.0 + min(max(proportional_error * n_steps / self.horizon, -0.2), 0.2)
        return self.coef

    def state_dict(self) -> dict:
        return {"coef": self.coef, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict) -> None:
        self.coef, self.target, self.horizon = state["coef"], state["target"], state["horizon"]
