"""PPO-Clip with GAE and a learned critic on the token-level MDP (`rlvr train --algo ppo`).

The MDP is TokenVectorEnv's: a state is the prompt plus the tokens so far, an
action is one token, and the reward is per token (docs/formulas.md, "PPO-Clip on the token MDP"):

    r_t = process_reward_t - kl_coef * KL_t(pi_old || pi_ref)  (+ sequence score on the last token)

One step: roll out rollout.prompts_per_step x rollout.group_size completions; score
them with the env's verifiers or a learned reward model (the task's process
rewards, on the tokens that end each reasoning step, count either way); compute old log-probs,
old values and reference log-probs; per-token rewards; GAE (gamma, lambda) over
valid tokens; returns = A + V before whitening A; then `ppo_epochs` passes over
shuffled minibatches, each an optimizer step of clipped surrogate + vf_coef *
clipped value loss (micro-batched with exact gradient accumulation). During the
first `critic_warmup_steps` steps only the critic learns. The KL coefficient is
fixed, or adaptive (PPO-Penalty) when `kl_target` is set.

The critic is a scalar head on the policy's backbone (`value_model = "head"`)
or a separate copy of the backbone (`"separate"`); see algos.model.value. Without one (`"none"`, V = 0, gamma =
lambda = 1) the advantages are the batch-whitened returns: REINFORCE++ (arXiv 2501.03262), the `reinforce_pp` preset;
`ppo.score_baseline = "group_mean"` first subtracts each prompt's mean score (REINFORCE++-baseline).

On a multi-turn task (tool calls, env replies: algos/rollout/multiturn.py) a row is a whole episode; its actions are the
tokens the policy sampled, and the tool outputs between them are context that neither the losses nor GAE count.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from algos.config import PolicyLossConfig, RolloutConfig, TrainConfig, require
from algos.core import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES
from algos.core.aggregation import aggregate_loss
from algos.core.gae import (
    AdaptiveKLController,
    clipped_value_loss,
    explained_variance,
    gae_advantages,
    masked_mean_std,
    masked_whiten,
    token_rewards,
    value_clip_fraction,
)
from algos.core.kl import kl_estimate
from algos.core.logprobs import logprobs_from_hidden
from algos.learn import MicroBatchSizer, accumulate_and_step
from algos.learn.rollout_correction import correction_weights, mismatch_metrics, resolved_method
from algos.learn.stats import UpdateStats
from algos.model.policy import completion_logprobs, lm_head_of
from algos.model.reward import RewardModel
from algos.model.value import VALUE_MODEL_KINDS, build_value_model, last_hidden_states, policy_backbone
from algos.rollout import ROLLOUT_ENGINES, RolloutBackend
from algos.rollout.metrics import policy_token_mask, rollout_metrics
from algos.rollout.multiturn import episode_metrics
from algos.run.loop import run_training, setup_run
from algos.run.reporting import MetricsLogger
from algos.run.rollout_pipeline import rollout_pipeline
from algos.system.distributed import (
    gather_padded,
    micro_batch_inputs,
    padded_micro_batches,
    rank_offset,
    sum_over_ranks,
)
from algos.system.runtime import advance_schedule

REWARD_SOURCES = ("env", "model")


@dataclass
class PPOSection:
    ppo_epochs: int = 4  # passes over each rollout batch (TRL's num_ppo_epochs: 4)
    num_minibatches: int = 2  # optimizer steps per epoch; rows are reshuffled every epoch
    gamma: float = 1.0  # discount (TRL: 1; an episode is one completion)
    lam: float = 0.95  # GAE lambda (TRL: 0.95; verl: 1.0)
    whiten_advantages: bool = True  # masked mean/std over the batch, after returns were taken
    # "head" on the policy's backbone, a "separate" critic copied from it, or "none": V = 0, so GAE's advantages are
    # the returns (REINFORCE++ with gamma = lam = 1 and whitening)
    value_model: str = "head"
    # Subtracted from each sequence score before the per-token rewards: "none", or "group_mean": the mean score of the
    # prompt's rollout.group_size completions (REINFORCE++-baseline, OpenRLHF's reinforce_baseline; needs >= 2 samples)
    score_baseline: str = "none"
    value_clip: float | None = 0.2  # clip V within +-c of V_old in the value loss (TRL's cliprange_value: 0.2; None = off)
    vf_coef: float = 0.1  # weight of the value loss in the total loss (TRL's PPOConfig default)
    critic_lr: float | None = None  # None = 10 x optim.lr (verl's PPO examples: critic lr 10x the actor's)
    critic_warmup_steps: int = 0  # first N steps train only the critic (the policy is frozen)
    kl_coef: float = 0.05  # per-token KL penalty in the reward (TRL's PPOConfig default); 0 = no reference model
    kl_estimator: str = "k1"  # per-token KL in the reward: k1 = log(pi/pi_ref), as InstructGPT
    kl_clamp: float = 10.0
    kl_target: float | None = None  # set = PPO-Penalty: adapt kl_coef toward this per-sequence KL (Ziegler: 6)
    kl_horizon: int = 10000  # rows over which the adaptive coefficient moves by at most 20% (Ziegler et al.)
    reward_source: str = "env"  # "env": the task's verifiers; "model": a learned reward model's score
    reward_model: str | None = None  # local AutoModelForSequenceClassification directory (reward_source=model)
    reward_model_batch_size: int = 16

    def validate(self) -> None:
        for name in ("ppo_epochs", "num_minibatches", "reward_model_batch_size", "kl_horizon"):
            require(getattr(self, name) >= 1, f"ppo.{name}", "must be >= 1")
        require(0 < self.gamma <= 1, "ppo.gamma", "must be in (0, 1]")
        require(0 <= self.lam <= 1, "ppo.lam", "must be in [0, 1]")
        require(self.value_model in (*VALUE_MODEL_KINDS, "none"), "ppo.value_model",
                f"must be one of {(*VALUE_MODEL_KINDS, 'none')}")
        require(self.value_model != "none" or self.critic_warmup_steps == 0, "ppo.critic_warmup_steps",
                "must be 0 when ppo.value_model is 'none': there is no critic to warm up")
        require(self.score_baseline in ("none", "group_mean"), "ppo.score_baseline",
                f"must be 'none' or 'group_mean', got {self.score_baseline!r}")
        require(self.value_clip is None or self.value_clip > 0, "ppo.value_clip", "must be > 0 or null")
        require(self.vf_coef > 0, "ppo.vf_coef", "must be > 0")
        require(self.critic_lr is None or self.critic_lr > 0, "ppo.critic_lr", "must be > 0 or null")
        require(self.critic_warmup_steps >= 0, "ppo.critic_warmup_steps", "must be >= 0")
        require(self.kl_coef >= 0, "ppo.kl_coef", "must be >= 0")
        require(self.kl_estimator in KL_ESTIMATORS, "ppo.kl_estimator", f"must be one of {KL_ESTIMATORS.names}")
        require(self.kl_clamp > 0, "ppo.kl_clamp", "must be > 0")
        require(self.kl_target is None or self.kl_target > 0, "ppo.kl_target", "must be > 0 or null")
        require(self.kl_target is None or self.kl_coef > 0, "ppo.kl_coef", "must be > 0 when ppo.kl_target is set")
        require(self.reward_source in REWARD_SOURCES, "ppo.reward_source", f"must be one of {REWARD_SOURCES}")
        require(self.reward_source != "model" or bool(self.reward_model), "ppo.reward_model",
                 "must name a reward model directory when ppo.reward_source is 'model'")
        require(self.reward_source == "model" or self.reward_model is None, "ppo.reward_model",
                 "is set, but ppo.reward_source is 'env', so it would be ignored: set ppo.reward_source = 'model'")


@dataclass
class PPOConfig(TrainConfig):
    """PPO: the shared sections plus `ppo`."""
    ppo: PPOSection = field(default_factory=PPOSection)
    # PPO's policy loss: a token mean (TRL's and verl's PPO), 16 rows per forward/backward ("auto" and a memory
    # budget as GRPO's, the probe running the critic's forward too).
    loss: PolicyLossConfig = field(default_factory=lambda: PolicyLossConfig(aggregation="token-mean", micro_batch_size=16))
    # 16 prompts x 1 completion a step: the critic is the baseline, so one sample a prompt suffices
    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(prompts_per_step=16, group_size=1))

    def validate(self) -> None:
        super().validate()
        rows = self.rollout.prompts_per_step * self.rollout.group_size
        require(self.ppo.num_minibatches <= rows, "ppo.num_minibatches", f"must be <= rows per step ({rows})")
        require(self.ppo.score_baseline == "none" or self.rollout.group_size >= 2, "rollout.group_size",
                "must be >= 2 for ppo.score_baseline = 'group_mean' (a prompt's mean score over its samples)")
        require(self.ppo.critic_warmup_steps < self.run.steps, "ppo.critic_warmup_steps",
                 f"must be < run.steps ({self.run.steps}), or the policy never trains")
        require(self.loss.surrogate != "gmpo", "loss.surrogate",
                "'gmpo' takes one advantage per row, and GAE gives one per token: use 'ppo-clip', 'gspo' or 'cispo'")


Config = PPOConfig
# REINFORCE++ (Hu 2025, arXiv 2501.03262; verl's reinforce_plus_plus, OpenRLHF's reinforce++): no critic, the token-level
# KL in the reward (ppo.kl_coef), the returns whitened over the batch. "_baseline" subtracts each prompt's mean score
# first, over 4 samples per prompt (verl's reinforce_plus_plus_baseline, OpenRLHF's reinforce_baseline).
REINFORCE_PP_PRESET: dict[str, Any] = {"ppo": {"value_model": "none", "gamma": 1.0, "lam": 1.0, "whiten_advantages": True}}
REINFORCE_PP_BASELINE_PRESET: dict[str, Any] = {
    "ppo": {**REINFORCE_PP_PRESET["ppo"], "score_baseline": "group_mean"}, "rollout": {"group_size": 4},
}
PRESETS = {"reinforce_pp": REINFORCE_PP_PRESET, "reinforce_pp_baseline": REINFORCE_PP_BASELINE_PRESET}


@dataclass
class Batch:
    """One rollout prepared for the update. [N, P+T] ids/mask; every per-token tensor is [N, T]."""
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_width: int
    mask: torch.Tensor  # Float[N, T] 1 on completion tokens
    old_logp: torch.Tensor
    old_values: torch.Tensor
    advantages: torch.Tensor  # whitened when ppo.whiten_advantages
    returns: torch.Tensor
    shuffle_seed: int  # the minibatch shuffles' seed: the same on every rank, a pure function of (run.seed, step)
    # [N, T] pi_old / pi_rollout as loss.rollout_correction shapes it, on each token's policy loss; None: off
    rollout_weights: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]


def _check_reward_model(p: PPOSection) -> None:
    """A ValueError naming ppo.reward_model unless it is a local one-label ...ForSequenceClassification directory:
    a causal LM would get a score head initialised at random (PPO would chase noise)."""
    from transformers import AutoConfig

    if not Path(p.reward_model).is_dir():
        raise ValueError(f"config ppo.reward_model: {p.reward_model!r} is not a local directory")
    reward_config = AutoConfig.from_pretrained(p.reward_model)
    architectures = reward_config.architectures or []
    if not any(name.endswith("ForSequenceClassification") for name in architectures):
        raise ValueError(
            f"config ppo.reward_model: {p.reward_model!r} holds {architectures or 'no architecture'}, not a trained "
            f"reward model (a ...ForSequenceClassification with its score head; examples/train_reward_model.py makes one)"
        )
    # transformers saves no label map for its default of 2 labels, so AutoConfig's count is the saved head's
    if reward_config.num_labels != 1:  # from_pretrained(num_labels=1) would fail on the head's shape, in a traceback
        raise ValueError(f"config ppo.reward_model: {p.reward_model!r} scores {reward_config.num_labels} labels; a "
                         "reward model scores one")


class PPOTrainer:
    def __init__(self, config: PPOConfig, *, resume: bool = False, backend: RolloutBackend | None = None) -> None:
        """``backend``: the rollout backend (default: the one config.rollout names), e.g. a ScriptedRollout."""
        p = config.ppo
        if p.reward_source == "model":  # before setup_run writes (or deletes) anything
            _check_reward_model(p)
        self.run = setup_run(config, resume=resume, backend=backend, keep_reference=p.kl_coef > 0)
        config = self.run.config  # resolved: every "auto" as this run takes it
        self.config, self.policy, self.tokenizer, self.ref_model = config, self.run.model, self.run.tokenizer, self.run.ref_model
        self.env, self.backend, self.scaler = self.run.env, self.run.backend, self.run.scaler
        self.critic = build_value_model(self.policy, p.value_model) if p.value_model != "none" else None
        # Both trained modules in one wrapped module: one optimizer step clips and applies every gradient together
        # (a shared backbone appears once: the critic registers only what it owns), and every forward is synchronised.
        trained = {"policy": self.policy, **({"critic": self.critic} if self.critic is not None else {})}
        # Some trained weights get no gradient in a pass: the policy's in the critic warm-up, the critic's in the warm start.
        self.forward = self.run.wrap(some_frozen=p.critic_warmup_steps > 0 or config.warm_start.steps > 0, **trained)
        self.modules = self.run.modules
        self.micro_batch_sizer = MicroBatchSizer(config.loss, self.run.device, self.forward)
        off_policy = ROLLOUT_ENGINES[config.rollout.backend].own_weights or config.rollout.max_staleness > 0
        self.rollout_correction = resolved_method(config.loss.rollout_correction, off_policy)
        # Dropout off throughout (as TRL's PPO): old and new log-probs/values must come from the same function.
        self.modules.eval()
        # The policy's schedule starts after the critic warm-up (as verl steps the actor's only when it updates).
        delays = (p.critic_warmup_steps, 0) if self.critic is not None else ()
        # a resumed run restores the critic's weights with the policy's
        self.optimizer, self.scheduler, self.start_step, state = self.run.optimization(self._parameter_groups(), delays)
        self.kl_controller = AdaptiveKLController(p.kl_coef, p.kl_target, p.kl_horizon)
        self.reward_model = None
        if p.reward_source == "model":
            self.reward_model = RewardModel.from_pretrained(p.reward_model, device=str(self.run.device),
                                                            batch_size=p.reward_model_batch_size)
        if state:
            self.kl_controller.load_state_dict(state["kl_controller"])
        # rollout.max_staleness: each step's rows sampled and scored ahead (algos/run/rollout_pipeline.py); the
        # log-probs, values and KL that make the batch are the learner's, at training time (prepare)
        self.rollouts = rollout_pipeline(self.run, self.draw, self.start_step, state.get("rollouts"),
                                         unit=config.rollout.group_size)  # a group's baseline is its learner's

    def _parameter_groups(self) -> list[dict]:
        """AdamW's groups: the policy's trainable weights (optim.lr) and the critic's own (ppo.critic_lr, default 10x)."""
        optim = self.config.optim
        critic_lr = self.config.ppo.critic_lr or 10 * optim.lr
        groups = [{"params": [q for q in self.policy.parameters() if q.requires_grad], "lr": optim.lr}]
        if self.critic is not None:
            groups.append({"params": list(self.critic.parameters()), "lr": critic_lr})
        return groups

    # ------------------------------------------------------------ forward passes

    def _logprobs_and_values(
        self, ids: torch.Tensor, mask: torch.Tensor, prompt_width: int, train_policy: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """[n, P+T] ids/mask -> ([n, T] log pi, [n, T] entropy, [n, T] values V(s_t)); log pi and entropy
        are None when ``train_policy`` is False (critic warm-up). Without a critic the values are 0."""
        temperature = self.config.rollout.temperature
        if self.critic is None:
            logp, entropy = completion_logprobs(self.policy, ids, mask, prompt_width, temperature,
                                                self.config.loss.logprob_chunk_size, len(self.tokenizer))
            return logp, entropy, torch.zeros_like(logp)
        if self.critic.shares_policy_backbone:
            # One backbone pass serves both heads; during warm-up it runs without a graph so only the head learns.
            with torch.set_grad_enabled(torch.is_grad_enabled() and train_policy):
                hidden = self.critic.hidden_states(ids, mask)[:, prompt_width - 1 : -1]
            values = self.critic.values_from_hidden(hidden)
            if not train_policy:
                return None, None, values
            logp, entropy = self._logprobs_from_hidden(self.policy, hidden, ids[:, prompt_width:])
            return logp, entropy, values
        # Value of the state before completion token t is read where that token is predicted (P-1+t).
        values = self.critic(ids, mask)[:, prompt_width - 1 : -1]
        if not train_policy:
            return None, None, values
        logp, entropy = completion_logprobs(self.policy, ids, mask, prompt_width, temperature,
                                            self.config.loss.logprob_chunk_size, len(self.tokenizer))
        return logp, entropy, values

    def _reference_logprobs(self, ids: torch.Tensor, mask: torch.Tensor, prompt_width: int) -> torch.Tensor:
        """[n, P+T] ids/mask -> [n, T] log pi_ref, computed as the policy's are (a head critic's full forward, else
        completion_logprobs' shared-prompt KV cache), so equal weights give a KL of exactly 0. The two paths differ
        by float rounding (~5e-7): on a batch of equal rewards that was the only advantage signal, and whitening
        and AdamW's scale invariance made a full-size update of it. A LoRA policy's reference is its base model."""
        return self.run.reference(self._reference_pass, ids, mask, prompt_width)

    def _reference_pass(self, ids: torch.Tensor, mask: torch.Tensor, prompt_width: int) -> torch.Tensor:
        if self.critic is not None and self.critic.shares_policy_backbone:
            hidden = last_hidden_states(policy_backbone(self.ref_model), ids, mask)[:, prompt_width - 1 : -1]
            return self._logprobs_from_hidden(self.ref_model, hidden, ids[:, prompt_width:])[0]
        return completion_logprobs(self.ref_model, ids, mask, prompt_width, self.config.rollout.temperature,
                                   self.config.loss.logprob_chunk_size, len(self.tokenizer))[0]

    def _logprobs_from_hidden(self, model, hidden: torch.Tensor, completion_ids: torch.Tensor):
        """[n, T, H] hidden states that predict [n, T] completion ids -> ([n, T] log-probs, [n, T] entropy) through
        ``model``'s LM head, at the rollout's temperature."""
        weight, transform = lm_head_of(model, len(self.tokenizer))
        return logprobs_from_hidden(hidden, weight, completion_ids, self.config.rollout.temperature,
                                    self.config.loss.logprob_chunk_size, transform)

    def _micro_batch_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int) -> int:
        """Rows per micro-batch for these [N, P+T] rows (algos/learn/micro_batches.py), probed on PPO's training
        forward: the policy's log-probs and the critic's values. Every rank calls it."""

        def training_forward(rows: torch.Tensor):
            return self._logprobs_and_values(input_ids[rows], attention_mask[rows], prompt_width)

        return self.micro_batch_sizer.batch_rows((input_ids, attention_mask, prompt_width), training_forward,
                                                 self.modules.parameters())

    def _micro_batches(self, rows: torch.Tensor, size: int) -> list[torch.Tensor | None]:
        """``rows`` in micro-batches of ``size``, padded with None (zero-weight passes) to the most any rank has."""
        return padded_micro_batches(list(rows.split(size)))

    def _forward(self, batch_ids: torch.Tensor, batch_mask: torch.Tensor, prompt_width: int, rows: torch.Tensor | None,
                 train_policy: bool = True):
        """_logprobs_and_values of ``rows`` through the wrapped module; None: a zero-weight pass over one row of two
        pad tokens (a rank with fewer micro-batches runs it, so every rank makes as many passes)."""
        inputs = micro_batch_inputs(batch_ids, batch_mask, prompt_width, rows, self.env.pad_id)
        return self.forward(self._logprobs_and_values, *inputs, train_policy)

    # ------------------------------------------------------------ rollout and advantages

    def _scores(self, rollout) -> torch.Tensor:
        if self.reward_model is None:
            return rollout.scores.float().clone()
        prompts = [problem.prompt for problem in rollout.problems]
        return self.reward_model.score(prompts, rollout.completions).to(self.run.device)

    def collect(self, step: int) -> tuple[Batch, dict[str, float]]:
        """Sample and score a batch (draw), then prepare it: the synchronous step's collection."""
        return self.prepare(step, *self.draw(step))

    def draw(self, step: int, policy: torch.nn.Module | None = None,
             backend: RolloutBackend | None = None) -> tuple[tuple[Any, torch.Tensor], dict[str, float]]:
        """Sample step ``step``'s rows (by ``backend`` from ``policy``; None: the run's) and score them ->
        ((the rollout, its [N] scores), the rollout's metrics)."""
        with torch.no_grad():
            rollout = self.run.sample(backend or self.backend, step, policy=policy)
            scores = self._scores(rollout)
        return (rollout, scores), {**rollout_metrics(rollout, scores), **episode_metrics(rollout)}

    def prepare(self, step: int, drawn: tuple[Any, torch.Tensor], metrics: dict[str, float]) -> tuple[Batch, dict[str, float]]:
        """A drawn batch's rollout-time log-probs and values (the policy's and critic's now), the KL to the reference,
        then GAE's advantages and returns."""
        # No graph for rollout-time quantities (a with-block, not a decorator: mutmut skips decorated functions).
        with torch.no_grad():
            p, r = self.config.ppo, self.config.rollout
            rollout, scores = drawn
            if p.score_baseline == "group_mean":  # each group is on this rank: its mean is local
                scores = ADVANTAGE_ESTIMATORS["dr-grpo"](scores, r.group_size)
            input_ids = torch.cat([rollout.prompt_ids, rollout.response_ids], dim=1)
            attention_mask = torch.cat([rollout.prompt_mask, rollout.response_mask], dim=1)
            prompt_width = rollout.prompt_ids.shape[1]
            # The tokens the policy sampled: on a multi-turn episode the tool outputs and env messages between its
            # messages are context (attention_mask) but no action, so GAE steps over them (core.gae: a hole in the
            # mask is transparent) and the episode's return lands on the policy's last token.
            mask = policy_token_mask(rollout).float()
            old_logp, old_values, kl = self._rollout_forward(input_ids, attention_mask, prompt_width, mask)
            rows = sum_over_ranks(input_ids.shape[0])[0]
            if kl is not None:
                kl_sum, tokens = sum_over_ranks(kl.sum().item(), mask.sum().item())
                sequence_kl = kl_sum / rows
                metrics.update({"kl": kl_sum / max(tokens, 1.0), "kl_sequence": sequence_kl,
                                "kl_coef": self.kl_controller.coef})
            # The task's per-step (process) rewards sit on the tokens that ended each reasoning step.
            rewards = token_rewards(mask, scores, process_rewards=rollout.process_rewards, kl=kl,
                                    kl_coef=self.kl_controller.coef)
            advantages, returns = self._advantages(rewards, old_values, mask, metrics)
            # Not while the critic warms up: the policy is the reference then (KL 0), which would shrink kl_coef.
            if kl is not None and step > p.critic_warmup_steps:
                self.kl_controller.update(sequence_kl, n_steps=int(rows))
            shuffle_seed = int(np.random.SeedSequence([self.config.run.seed, step]).generate_state(1)[0])
            weights = self._rollout_weights(rollout, old_logp, mask, metrics)
            batch = Batch(input_ids, attention_mask, prompt_width, mask, old_logp, old_values, advantages, returns,
                          shuffle_seed, rollout_weights=weights)
            return batch, metrics

    def _rollout_weights(self, rollout, old_logp: torch.Tensor, mask: torch.Tensor,
                         metrics: dict[str, float]) -> torch.Tensor | None:
        """[N, T] rollout-correction weights pi_old / pi_rollout (loss.rollout_correction; None when off or when the
        backend gives no log-probs); the mismatch goes into ``metrics`` whenever it can be measured. The policy's
        old log-probs are PPO's own rollout-time forward, so one measure per batch serves every epoch."""
        rollout_logp = getattr(rollout, "logprobs", None)  # a backend may return the env's RolloutResult as is
        if rollout_logp is None:  # the same on every rank (one backend): no collective is skipped by some only
            return None
        sums: dict[str, float] = {}
        weights = correction_weights(self.rollout_correction, self.config.loss.rollout_correction_cap, old_logp,
                                     rollout_logp.to(old_logp.dtype), mask, sums)
        num_tokens, num_seqs = sum_over_ranks(mask.sum().item(), (mask.sum(-1) > 0).sum().item())
        metrics.update(mismatch_metrics(sums, max(num_tokens, 1.0), num_seqs))
        return None if self.rollout_correction == "none" else weights

    def _rollout_forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int, mask: torch.Tensor):
        """[N, P+T] sampled rows -> ([N, T] log pi_old, [N, T] V_old, [N, T] per-token KL to the reference or None)."""
        p = self.config.ppo
        old_logp, old_values, ref_logp = [], [], []
        size = self._micro_batch_rows(input_ids, attention_mask, prompt_width)
        for rows in self._micro_batches(torch.arange(input_ids.shape[0], device=self.run.device), size):
            logp, _, values = self._forward(input_ids, attention_mask, prompt_width, rows)
            if rows is None:
                continue
            old_logp.append(logp)
            old_values.append(values)
            if self.ref_model is not None:
                ref_logp.append(self._reference_logprobs(input_ids[rows], attention_mask[rows], prompt_width))
        old_logp = torch.cat(old_logp)
        kl = kl_estimate(old_logp, torch.cat(ref_logp), p.kl_estimator, p.kl_clamp) * mask if ref_logp else None
        return old_logp, torch.cat(old_values), kl

    def _advantages(self, rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, metrics: dict[str, float]):
        """[N, T] rewards and V_old -> ([N, T] GAE advantages, whitened when ppo.whiten_advantages, [N, T] returns
        A + V taken before whitening); their statistics go into ``metrics``. Statistics and whitening are over every
        rank's rows (each row's GAE is its own)."""
        p = self.config.ppo
        advantages, returns = gae_advantages(rewards, values, mask, p.gamma, p.lam)
        (all_advantages, all_returns, all_values, all_mask), first = gather_padded(advantages, returns, values, mask)
        metrics["advantages_mean"], metrics["advantages_std"] = masked_mean_std(all_advantages, all_mask)
        metrics["returns_mean"], metrics["returns_std"] = masked_mean_std(all_returns, all_mask)
        if self.critic is not None:
            metrics["values_mean"], _ = masked_mean_std(all_values, all_mask)
            metrics["explained_variance"] = explained_variance(all_values, all_returns, all_mask).item()
        if p.whiten_advantages:
            rows, width = advantages.shape
            advantages = masked_whiten(all_advantages, all_mask)[first : first + rows, :width]
        return advantages, returns

    # ------------------------------------------------------------ update

    def update(self, batch: Batch, train_policy: bool) -> dict[str, float]:
        """ppo_epochs x num_minibatches optimizer steps; returns token-weighted means of the loss stats. A minibatch is
        a share of the whole batch (every rank's rows, shuffled by one permutation on every rank); each rank computes
        its own rows of it, and normalisers are the minibatch's over all ranks."""
        p, world = self.config.ppo, self.run.world
        stats, tokens_seen = UpdateStats(), []
        skipped, grad_norms = 0, []
        first, total_rows = rank_offset(batch.num_rows), int(sum_over_ranks(batch.num_rows)[0])
        shuffles = torch.Generator().manual_seed(batch.shuffle_seed)
        size = self._micro_batch_rows(batch.input_ids, batch.attention_mask, batch.prompt_width)

        for _ in range(p.ppo_epochs):
            order = torch.randperm(total_rows, generator=shuffles).to(self.run.device)
            for minibatch in order.tensor_split(p.num_minibatches):
                mine = minibatch[(minibatch >= first) & (minibatch < first + batch.num_rows)] - first  # this rank's rows
                # Every micro-batch divides by the minibatch's token count: their sum is the minibatch loss.
                minibatch_tokens = max(1.0, sum_over_ranks(batch.mask[mine].sum().item())[0])
                norms = {"global_num_tokens": minibatch_tokens, "global_num_seqs": max(1, len(minibatch)),
                         "token_budget": self.config.env.max_new_tokens}
                micro_batch_loss = functools.partial(self._micro_batch_loss, batch, train_policy=train_policy,
                                                     norms=norms, stats=stats, tokens_seen=tokens_seen)
                step = accumulate_and_step(self._micro_batches(mine, size), micro_batch_loss, forward=self.forward,
                                           device_type=self.run.device.type, modules=self.modules,
                                           optimizer=self.optimizer, scaler=self.scaler,
                                           max_grad_norm=self.config.optim.max_grad_norm, world_size=world.size)
                skipped += not step.applied
                grad_norms.append(step.grad_norm)
        lr, *critic_lr = advance_schedule(self.scheduler)
        tokens_seen = sum_over_ranks(sum(tokens_seen))[0]
        return {**stats.over_ranks().means(max(tokens_seen, 1.0)), "grad_norm": sum(grad_norms) / len(grad_norms),
                "skipped_updates": skipped, "lr": lr, **({"critic_lr": critic_lr[0]} if critic_lr else {}),
                "critic_warmup": float(not train_policy), "micro_batch_rows": float(size)}

    def _micro_batch_loss(self, batch: Batch, rows: slice | None, *, train_policy: bool, norms: dict[str, float],
                          stats: UpdateStats, tokens_seen: list[float]) -> torch.Tensor:
        """PPO's loss of one micro-batch of a minibatch: vf_coef x the clipped value loss (with a critic) plus the
        clipped surrogate minus the entropy bonus (when the policy trains), over the minibatch's token count
        (``norms``); its statistics go to ``stats`` and its token count to ``tokens_seen``. ``rows`` None: a
        zero-weight pass."""
        p, loss_cfg = self.config.ppo, self.config.loss
        logp, entropy, values = self._forward(batch.input_ids, batch.attention_mask, batch.prompt_width, rows,
                                              train_policy)
        if rows is None:
            return values.sum() * 0.0 + (logp.sum() * 0.0 if logp is not None else 0.0)
        m = batch.mask[rows]
        n_tokens, minibatch_tokens = m.sum().item(), norms["global_num_tokens"]
        loss = torch.zeros((), device=m.device)
        if self.critic is not None:
            value_loss_tokens, clipped = clipped_value_loss(values, batch.old_values[rows], batch.returns[rows],
                                                            p.value_clip)
            value_loss = aggregate_loss(value_loss_tokens, m, "token-mean", global_num_tokens=minibatch_tokens)
            loss = p.vf_coef * value_loss
            stats.add("value_loss", value_loss.item() * minibatch_tokens)  # this micro-batch's token sum
            stats.add("value_clip_frac", value_clip_fraction(clipped, m).item(), n_tokens)
        if train_policy:
            out = POLICY_LOSSES[loss_cfg.surrogate](logp, batch.old_logp[rows], batch.advantages[rows], m,
                                                    loss_cfg.eps_low, loss_cfg.eps_high, loss_cfg.dual_clip)
            per_token = out.per_token_loss
            if batch.rollout_weights is not None:
                per_token = per_token * batch.rollout_weights[rows]
            if loss_cfg.entropy_coef:
                per_token = per_token - loss_cfg.entropy_coef * entropy * m
            policy_loss = aggregate_loss(per_token, m, loss_cfg.aggregation, **norms)
            loss = loss + policy_loss
            stats.add("policy_loss", policy_loss.item() * minibatch_tokens)
            with torch.no_grad():
                # Drift from the rollout policy, KL(pi_old || pi): k1 = log(pi_old/pi), k3 >= 0.
                for estimator in ("k1", "k3"):
                    drift = kl_estimate(batch.old_logp[rows], logp, estimator, p.kl_clamp) * m
                    stats.add(f"approx_kl_{estimator}", drift.sum().item())
                stats.add("entropy", (entropy * m).sum().item())
            stats.add_surrogate(out.stats, n_tokens)
        tokens_seen.append(n_tokens)
        return loss

    # ------------------------------------------------------------ loop

    def save(self, step: int) -> Path:
        state = {"kl_controller": self.kl_controller.state_dict(), "rollouts": self.rollouts.state(step)}
        return self.run.save(step, self.optimizer, self.scheduler, state)

    def train_step(self, step: int, logger: MetricsLogger) -> dict[str, float]:
        batch, metrics = self.prepare(step, *self.rollouts.batch_for(step))
        metrics.update(self.update(batch, train_policy=step > self.config.ppo.critic_warmup_steps))
        if metrics["skipped_updates"]:
            logger.write(f"step {step}: {metrics['skipped_updates']} updates skipped (non-finite loss or gradient)")
        self.rollouts.weights_after(step)
        return metrics

    def train(self) -> dict[str, Any]:
        return run_training(self)


def train(config: PPOConfig, *, resume: bool = False) -> dict[str, Any]:
    """Run PPO as configured; returns eval accuracy before/after and the plot path."""
    return PPOTrainer(config, resume=resume).train()
