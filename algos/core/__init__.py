"""Pure tensor functions shared by every agent (GRPO, DAPO, PPO), and their registries.

Tensors in, tensors out, shapes in each function's one-line docstring; no models and no
environments (the one stateful object, gae.AdaptiveKLController, holds a coefficient and nothing
else). B = rows (completions), T = completion tokens, V = vocabulary, H = hidden size, G = group size.

Variants are registered by name (variants.Registry): ADVANTAGE_ESTIMATORS, POLICY_LOSSES,
LOSS_AGGREGATIONS, KL_ESTIMATORS, ROLLOUT_CORRECTIONS, PREFERENCE_LOSSES; the configs' allowed values are their names.
"""

from algos.core.advantages import ADVANTAGE_ESTIMATORS
from algos.core.aggregation import LOSS_AGGREGATIONS
from algos.core.importance_weights import ROLLOUT_CORRECTIONS
from algos.core.kl import KL_ESTIMATORS
from algos.core.policy_loss import POLICY_LOSSES
from algos.core.preference import PREFERENCE_LOSSES

__all__ = [
    "ADVANTAGE_ESTIMATORS", "KL_ESTIMATORS", "LOSS_AGGREGATIONS", "POLICY_LOSSES", "PREFERENCE_LOSSES", "ROLLOUT_CORRECTIONS",
]
