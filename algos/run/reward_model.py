"""Bradley-Terry reward-model training on preference pairs, on the update engine every trainer uses
(learn.accumulate_and_step): micro-batches of pairs with exact gradient accumulation, then the guarded, clipped
AdamW step with [optim]'s rate and schedule. `examples/train_reward_model.py` runs it; the model it fits plugs into
PPO (`ppo.reward_source = "model"`, algos/model/reward.py scores with it)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from functools import partial

import torch

from algos.config import OptimConfig, require
from algos.learn import accumulate_and_step
from algos.model.reward import PreferencePair, RewardModel, bradley_terry_loss
from algos.system.runtime import advance_schedule, build_optimizer, build_scheduler


@dataclass
class BradleyTerryConfig:
    """[reward_model]: what the pairs are and how they are batched."""

    epochs: int = 1  # passes over the pairs, each in a new order
    pairs_per_step: int = 8  # pairs per optimizer step (TRL's RewardConfig per_device_train_batch_size: 8)
    micro_batch_pairs: int = 8  # pairs per forward/backward, chosen and rejected in one pass; the step is the same
    # TRL's center_rewards_coefficient (Eisenstein et al. 2023): coef x mean((r_chosen + r_rejected)^2) pulls the
    # rewards' mean toward 0, so the scale PPO sees stays bounded, without penalising the margin; 0 = off
    center_rewards_coef: float = 0.0
    seed: int = 0  # the pairs' order each epoch

    def validate(self) -> None:
        for name in ("epochs", "pairs_per_step", "micro_batch_pairs"):
            require(getattr(self, name) >= 1, f"reward_model.{name}", f"must be >= 1, got {getattr(self, name)}")
        require(self.center_rewards_coef >= 0, "reward_model.center_rewards_coef",
                f"must be >= 0, got {self.center_rewards_coef}")


@dataclass
class RewardModelTrainConfig:
    """Reward-model training: [optim] (AdamW; lr 1e-4, where TRL's RewardConfig takes 1e-5 for billion-parameter
    models: small ones need more) and [reward_model]."""

    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-4))
    reward_model: BradleyTerryConfig = field(default_factory=BradleyTerryConfig)

    def validate(self) -> None:
        self.optim.validate()
        self.reward_model.validate()


def _micro_batch_loss(reward_model: RewardModel, batch: list[PreferencePair], center_rewards_coef: float,
                      sums: dict[str, float], rows: slice) -> torch.Tensor:
    """The step's mean loss over the pairs ``batch[rows]``: their sum / the step's pairs (so the micro-batches' losses
    add up to the step's); their wins and margins added to ``sums``."""
    part = batch[rows]
    rewards = reward_model.rewards([p.prompt for p in part] * 2, [p.chosen for p in part] + [p.rejected for p in part])
    chosen, rejected = rewards.split(len(part))
    loss = bradley_terry_loss(chosen, rejected) * len(part)
    if center_rewards_coef:
        loss = loss + center_rewards_coef * (chosen + rejected).square().sum()
    sums["accuracy"] += (chosen > rejected).float().sum().item()
    sums["margin"] += (chosen - rejected).sum().item()
    return loss / len(batch)


def train_bradley_terry(reward_model: RewardModel, pairs: list[PreferencePair],
                        config: RewardModelTrainConfig | None = None) -> list[dict[str, float]]:
    """Fit ``reward_model`` so that r(chosen) > r(rejected) under the Bradley-Terry likelihood (plus the centering
    term). Returns one dict per optimizer step: loss, accuracy (chosen above rejected in its pairs), mean margin."""
    config = config or RewardModelTrainConfig()
    config.validate()
    if not pairs:
        raise ValueError("train_bradley_terry needs at least one preference pair")
    settings, model = config.reward_model, reward_model.model
    steps_per_epoch = math.ceil(len(pairs) / settings.pairs_per_step)
    optimizer = build_optimizer(model, config.optim)
    scheduler = build_scheduler(optimizer, config.optim, settings.epochs * steps_per_epoch)
    no_scaling = torch.amp.GradScaler(enabled=False)
    order_rng = random.Random(settings.seed)
    model.train()
    history = []
    for _ in range(settings.epochs):
        order = list(range(len(pairs)))
        order_rng.shuffle(order)
        for start in range(0, len(order), settings.pairs_per_step):
            batch = [pairs[i] for i in order[start : start + settings.pairs_per_step]]
            sums = {"accuracy": 0.0, "margin": 0.0}
            micro = [slice(i, i + settings.micro_batch_pairs) for i in range(0, len(batch), settings.micro_batch_pairs)]
            loss = partial(_micro_batch_loss, reward_model, batch, settings.center_rewards_coef, sums)
            step = accumulate_and_step(micro, loss, forward=model, device_type=reward_model.device.type,
                                       modules=model, optimizer=optimizer, scaler=no_scaling,
                                       max_grad_norm=config.optim.max_grad_norm, world_size=1)
            if not step.applied and not math.isfinite(step.loss):
                raise FloatingPointError(f"Bradley-Terry loss became {step.loss} at step {len(history) + 1}")
            advance_schedule(scheduler)
            history.append({"loss": step.loss, "accuracy": sums["accuracy"] / len(batch),
                            "margin": sums["margin"] / len(batch), "grad_norm": step.grad_norm})
    model.eval()
    return history
