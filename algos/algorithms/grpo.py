"""GRPO (DeepSeekMath) and DAPO in one loop over algos.core.

One step: sample G (rollout.group_size) completions for each of rollout.prompts_per_step prompts by stepping a
TokenVectorEnv; shape rewards (DAPO soft overlong penalty, overlong filter); keep groups with
signal (DAPO dynamic sampling, bounded rounds); advantages from grpo.adv_estimator (plus, with
`grpo.process_weight`, DeepSeekMath process supervision from the task's step rewards); then
`num_iterations` clipped-surrogate updates over micro-batches with gradient accumulation, KL to a
frozen reference when beta > 0. DAPO is the `dapo` preset (DAPO_PRESET); each of its parts is a
switch. The formulas: docs/formulas.md.

On a multi-turn task (a MultiTurnTask: tool calls, env replies) the backend plays whole episodes
(algos/rollout/multiturn.py) and the same loop trains on them: a row is the episode after its initial prompt, groups are
per initial prompt, and lengths and the loss count the policy's own tokens (tool outputs and env messages masked).

Dynamic sampling bound: at most `max_sampling_rounds` generation rounds per step.
A group is informative when its task scores (accuracy, before the soft overlong penalty)
differ, or with process supervision its step rewards do, and at least one of its rows is
trained on. When the bound is hit with fewer than
rollout.prompts_per_step informative groups, the step trains on the groups it has (the loss
normalisers count only those); with none, the update is skipped and logged as
`skipped_update = 1`, as it is when every kept row's loss is masked (overlong filtering).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

import rewards
from algos.config import TrainConfig, require
from algos.core import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES
from algos.core.advantages import process_advantages, step_rewards_vary, zero_std_group_fraction
from algos.core.aggregation import aggregate_loss
from algos.core.kl import kl_estimate
from algos.core.padding import right_pad_cat
from algos.learn import MicroBatchSizer, accumulate_and_step
from algos.learn.rollout_correction import correction_weights, mismatch_metrics, resolved_method
from algos.learn.stats import UpdateStats
from algos.model.policy import completion_logprobs
from algos.rollout import ROLLOUT_ENGINES, RolloutBackend
from algos.rollout.metrics import policy_token_mask, rollout_metrics
from algos.rollout.multiturn import episode_metrics
from algos.run.loop import run_training, setup_run
from algos.run.reporting import MetricsLogger
from algos.run.rollout_pipeline import rollout_pipeline
from algos.system.distributed import (
    gather_rows,
    micro_batch_inputs,
    padded_micro_batches,
    rank_offset,
    sum_over_ranks,
)
from algos.system.runtime import advance_schedule


@dataclass
class GRPOSection:
    num_iterations: int = 1  # policy updates per rollout batch (mu in DeepSeekMath; >1 makes the ratio matter)
    beta: float = 0.04  # KL-to-reference coefficient in the loss (DeepSeekMath); 0 = no reference model kept
    kl_estimator: str = "k3"  # KL_ESTIMATORS: k3 (DeepSeekMath, verl's low_var_kl) or k2 (its gradient is the KL's)
    kl_clamp: float = 10.0  # per-token KL clamped to +-kl_clamp (verl's 10)
    # ADVANTAGE_ESTIMATORS: "grpo" (group std, DeepSeekMath), "batch-std" (group mean, batch std), "dr-grpo" (mean
    # only), "rloo" (each row against the mean of the others)
    adv_estimator: str = "grpo"
    adv_eps: float = 1e-6
    # DeepSeekMath process supervision, added to the outcome advantage with this weight: token t also gets the sum
    # of the group-normalised step rewards of the steps ending at or after t. Needs a task with process rewards
    # (Countdown's step_reward > 0). 0 = outcome supervision only (GRPO).
    process_weight: float = 0.0
    dynamic_sampling: bool = False  # DAPO: drop all-equal groups and sample more
    # What must vary within a group to keep it: "acc" (solved or not: DAPO, verl's filter_groups metric) or
    # "score" (the task score, format and partial credit included; e.g. reasoning-gym's partial scores).
    dynamic_sampling_metric: str = "acc"
    max_sampling_rounds: int = 4  # generation rounds per step at most; then train on what was kept
    overlong_filter: bool = False  # DAPO: truncated completions get no loss
    soft_overlong: bool = False  # DAPO: add the soft overlong penalty to the reward
    overlong_cache: int = 16  # L_cache of the soft penalty (tokens), L_max = env.max_new_tokens
    # R_len's weight in the reward. DAPO adds R_len in [-1, 0] to rewards of +-1; task scores here are in [0, 1], and
    # std-normalised group advantages ignore the map s -> 2s - 1, so 0.5 is DAPO's weighting (1.0 would make a right
    # answer ending at L_max score as a short wrong one). verl's overlong_buffer.penalty_factor.
    overlong_penalty_factor: float = 0.5

    def validate(self) -> None:
        require(self.num_iterations >= 1, "grpo.num_iterations", "must be >= 1")
        require(self.beta >= 0, "grpo.beta", "must be >= 0")
        require(self.kl_estimator in KL_ESTIMATORS, "grpo.kl_estimator", f"must be one of {KL_ESTIMATORS.names}")
        # In the loss, k1's expected gradient is beta * E[grad log pi] = 0: the KL term would only add noise.
        require(self.kl_estimator != "k1" or self.beta == 0, "grpo.kl_estimator",
                "k1 has zero expected gradient as a loss term: use k3 (DeepSeekMath, verl's low_var_kl) "
                "or k2 (its gradient is the KL's)")
        require(self.kl_clamp > 0, "grpo.kl_clamp", "must be > 0")
        require(self.adv_estimator in ADVANTAGE_ESTIMATORS, "grpo.adv_estimator", f"must be one of {ADVANTAGE_ESTIMATORS.names}")
        # eps > 0 keeps an all-equal group's advantages 0 / eps = 0 instead of 0 / 0 = NaN
        require(self.adv_eps > 0, "grpo.adv_eps", "must be > 0")
        require(self.process_weight >= 0, "grpo.process_weight", "must be >= 0")
        require(self.dynamic_sampling_metric in ("acc", "score"), "grpo.dynamic_sampling_metric",
                f"must be 'acc' or 'score', got {self.dynamic_sampling_metric!r}")
        require(self.overlong_penalty_factor >= 0, "grpo.overlong_penalty_factor", "must be >= 0")
        # run.setup.round_seed gives each step 101 prompt seeds; more rounds would repeat the next step's prompts
        require(1 <= self.max_sampling_rounds <= 101, "grpo.max_sampling_rounds", "must be in 1..101")
        require(self.overlong_cache >= 1, "grpo.overlong_cache", "must be >= 1")


@dataclass
class GRPOConfig(TrainConfig):
    """GRPO (and, through the `dapo` preset, DAPO): the shared sections plus `grpo`."""

    grpo: GRPOSection = field(default_factory=GRPOSection)

    def validate(self) -> None:
        super().validate()
        require(self.rollout.group_size >= 2, "rollout.group_size", "must be >= 2 (advantages compare samples of a group)")
        require(self.grpo.overlong_cache <= self.env.max_new_tokens or not self.grpo.soft_overlong,
                "grpo.overlong_cache", f"must be <= env.max_new_tokens ({self.env.max_new_tokens}) while grpo.soft_overlong "
                "is on (--algo dapo turns it on): DAPO's penalty grows over the budget's last grpo.overlong_cache "
                f"tokens; set grpo.overlong_cache <= {self.env.max_new_tokens}, or grpo.soft_overlong = false")
        require(self.loss.surrogate != "gmpo" or not self.grpo.process_weight, "grpo.process_weight",
                "gives per-token advantages, and loss.surrogate 'gmpo' takes one per row: set it to 0")


# DAPO (arXiv 2503.14476) = GRPO + these four switches + no KL; each can be turned off for ablation.
DAPO_PRESET: dict[str, Any] = {
    "loss": {
        "eps_high": 0.28,  # 1. clip-higher
        "aggregation": "token-mean",  # 3. token-level loss
    },
    "grpo": {
        "dynamic_sampling": True,  # 2. dynamic sampling
        "overlong_filter": True,  # 4. overlong filtering ...
        "soft_overlong": True,  # ... and soft overlong punishment
        "beta": 0.0,  # no KL term
    },
}

# RLOO (Ahmadian et al. 2024, arXiv 2402.14740; verl's and OpenRLHF's rloo): each sample's baseline is the mean of
# the other G - 1 of its prompt, no std scaling; no KL term, a token-mean loss (verl's default loss_agg_mode).
RLOO_PRESET: dict[str, Any] = {"grpo": {"adv_estimator": "rloo", "beta": 0.0}, "loss": {"aggregation": "token-mean"}}
# CISPO (MiniMax-M1, arXiv 2506.13585): the importance weight clipped above only (eps_low 1; eps_high 5, a cap of
# 1 + 5 = 6 on the weight: TRL's epsilon_high = 6, which caps at epsilon_high itself) and detached, on a
# REINFORCE token loss, token-mean, no KL; two updates per batch, so the weight leaves 1.
CISPO_PRESET: dict[str, Any] = {
    "loss": {"surrogate": "cispo", "eps_low": 1.0, "eps_high": 5.0, "aggregation": "token-mean"},
    "grpo": {"beta": 0.0, "num_iterations": 2},
}
# GMPO (arXiv 2507.20673): the geometric mean of the token ratios, each clipped in log space to (-0.4, 0.4), wider
# than PPO's; one loss per sequence, no KL; two updates per batch.
GMPO_PRESET: dict[str, Any] = {
    "loss": {"surrogate": "gmpo", "eps_low": 0.4, "eps_high": 0.4, "aggregation": "seq-mean-token-mean"},
    "grpo": {"beta": 0.0, "num_iterations": 2},
}

Config = GRPOConfig
PRESETS = {"dapo": DAPO_PRESET, "rloo": RLOO_PRESET, "cispo": CISPO_PRESET, "gmpo": GMPO_PRESET}


@dataclass
class SampledRows:
    """Rows of one generation round, rewards shaped: [n, P] prompt ids/mask, [n, T] response ids/mask, [n] scores
    (with the soft overlong penalty), [n, T] loss mask (overlong-filtered rows all 0), [n, T] step rewards and mask,
    [n, T] the sampler's log-probs (None when the backend gives none: scripted completions), [n, T] the policy's
    tokens (policy_token_mask: the response mask, less a multi-turn episode's tool outputs and env messages)."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    scores: torch.Tensor
    loss_mask: torch.Tensor
    step_rewards: torch.Tensor
    step_mask: torch.Tensor
    rollout_logp: torch.Tensor | None
    policy_mask: torch.Tensor

    def take(self, rows: torch.Tensor) -> SampledRows:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return SampledRows(**{name: None if value is None else value[rows] for name, value in values.items()})


@dataclass
class Batch:
    """The rows one step trains on: [N, P+T] ids/mask, [N, T] loss mask, [N] scores, [N] advantages ([N, T] with
    process supervision), [N, T] the policy's tokens (a multi-turn episode's tool outputs and env messages 0), and
    [N, T] the sampler's log-probs (None without)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_width: int
    loss_mask: torch.Tensor
    scores: torch.Tensor
    advantages: torch.Tensor
    policy_mask: torch.Tensor
    rollout_logp: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]


class _UpdateInputs(NamedTuple):
    """What every micro-batch of one update reads: the batch, its [N, T] loss and policy masks, the [N, T]
    pi_old and reference log-probs (None without), the loss's global normalisers, and the mismatch sums."""

    batch: Batch
    mask: torch.Tensor
    response_mask: torch.Tensor
    old_logp: torch.Tensor | None
    ref_logp: torch.Tensor | None
    norms: dict[str, float]
    mismatch: dict[str, float]


def shape_rewards(result, g: GRPOSection, max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A rollout's ([B] scores with DAPO's soft overlong penalty, [B, T] loss mask without overlong-filtered rows).
    Lengths and the loss mask count the policy's tokens only (policy_token_mask)."""
    policy_mask = policy_token_mask(result)
    lengths = policy_mask.sum(-1)
    scores = result.scores.float().clone()
    if g.soft_overlong:
        scores += g.overlong_penalty_factor * torch.tensor(
            [rewards.soft_overlong_penalty(int(n), max_new_tokens, g.overlong_cache) for n in lengths.tolist()],
            device=scores.device,
        )
    loss_mask = policy_mask.clone()
    if g.overlong_filter:
        keep = rewards.overlong_filter_mask(lengths.tolist(), max_new_tokens, truncated=result.truncated.tolist())
        loss_mask *= torch.tensor(keep, device=loss_mask.device, dtype=loss_mask.dtype).unsqueeze(-1)
    return scores, loss_mask


def informative_groups(result, loss_mask: torch.Tensor, g: GRPOSection, group_size: int) -> torch.Tensor:
    """[B // G] bool: DAPO keeps a group when its accuracy (or, as configured, its task score; either before the
    length penalty) varies and some row of it is trained on (overlong filtering may mask them all). With process
    supervision, step rewards that differ within the group are a signal too."""
    metric = result.solved.float() if g.dynamic_sampling_metric == "acc" else result.scores.float()
    metric = metric.reshape(-1, group_size)
    varies = metric.amax(1) > metric.amin(1)
    if g.process_weight:
        varies |= step_rewards_vary(result.process_rewards, result.process_step_mask, group_size)
    return varies & loss_mask.any(-1).reshape(-1, group_size).any(1)


def build_batch(kept: list[SampledRows], g: GRPOSection, group_size: int, pad_id: int, advantages: torch.Tensor) -> Batch:
    """The kept rows as one batch (prompts left-padded, completions right-padded to the widest round) with their
    [N] outcome ``advantages``, to which process supervision adds its per-token part."""
    width_p = max(part.prompt_ids.shape[1] for part in kept)
    width_t = max(part.response_ids.shape[1] for part in kept)
    ids, masks = [], []
    for part in kept:
        pad = (width_p - part.prompt_ids.shape[1], width_t - part.response_ids.shape[1])
        ids.append(torch.nn.functional.pad(torch.cat([part.prompt_ids, part.response_ids], 1), pad, value=pad_id))
        masks.append(torch.nn.functional.pad(torch.cat([part.prompt_mask, part.response_mask], 1), pad))
    if g.process_weight:
        step_rewards = right_pad_cat([part.step_rewards for part in kept], width_t)
        step_mask = right_pad_cat([part.step_mask for part in kept], width_t)
        advantages = advantages.unsqueeze(-1) + g.process_weight * process_advantages(
            step_rewards, step_mask, group_size, eps=g.adv_eps
        )
    return Batch(
        input_ids=torch.cat(ids),
        attention_mask=torch.cat(masks),
        prompt_width=width_p,
        loss_mask=right_pad_cat([part.loss_mask for part in kept], width_t),
        scores=torch.cat([part.scores for part in kept]),
        advantages=advantages,
        policy_mask=right_pad_cat([part.policy_mask for part in kept], width_t),
        rollout_logp=None if any(part.rollout_logp is None for part in kept)
        else right_pad_cat([part.rollout_logp for part in kept], width_t),
    )


def outcome_advantages(kept: list[SampledRows], g: GRPOSection, group_size: int) -> torch.Tensor:
    """[N] advantages of this rank's kept rows, computed over every rank's (batch-std's std is the global batch's);
    every rank calls it."""
    scores = torch.cat([part.scores for part in kept]) if kept else torch.zeros(0)
    everywhere = gather_rows(scores)
    first = rank_offset(scores.shape[0])
    return ADVANTAGE_ESTIMATORS[g.adv_estimator](everywhere, group_size, eps=g.adv_eps)[first : first + scores.shape[0]]


def first_groups(informative: torch.Tensor, kept_before: int, limit: int) -> tuple[torch.Tensor, int]:
    """DAPO's trim, global: [n] this rank's informative groups of a round -> ([n] those kept, groups kept after the
    round over every rank). The round's groups are ordered by global prompt (rank 0's first) and kept until
    ``limit`` groups are kept, so the kept rows are those one process would keep."""
    everywhere = gather_rows(informative)
    position = kept_before + everywhere.long().cumsum(0) - 1  # each informative group's place among the kept
    kept = everywhere & (position < limit)
    first = rank_offset(informative.shape[0])
    return kept[first : first + informative.shape[0]], min(limit, kept_before + int(everywhere.sum()))


class GRPOTrainer:
    def __init__(self, config: GRPOConfig, *, resume: bool = False, backend: RolloutBackend | None = None) -> None:
        """``backend``: the rollout backend (default: the one config.rollout names), e.g. a ScriptedRollout."""
        g = config.grpo
        self.run = setup_run(config, resume=resume, backend=backend, keep_reference=g.beta > 0,
                             check_task=lambda task: _check_process_rewards(config, task))
        config = self.run.config  # resolved: every "auto" as this run takes it
        self.config, self.model, self.tokenizer, self.ref_model = config, self.run.model, self.run.tokenizer, self.run.ref_model
        self.env, self.backend, self.scaler = self.run.env, self.run.backend, self.run.scaler
        self.forward = self.run.wrap(policy=self.model)  # every training forward goes through it (DDP, FSDP2)
        self.optimizer, self.scheduler, self.start_step, state = self.run.optimization()
        self.micro_batch_sizer = MicroBatchSizer(config.loss, self.run.device, self.forward)
        off_policy = ROLLOUT_ENGINES[config.rollout.backend].own_weights or config.rollout.max_staleness > 0
        self.rollout_correction = resolved_method(config.loss.rollout_correction, off_policy)
        # rollout.max_staleness: each step's batch drawn ahead, on a thread of its own (algos/run/rollout_pipeline.py)
        # (collect looked up at each call: a trainer whose collect is wrapped after construction draws through it)
        self.rollouts = rollout_pipeline(self.run, lambda step, **where: self.collect(step, **where), self.start_step,
                                         state.get("rollouts"), unit=config.rollout.group_size)

    # ------------------------------------------------------------ sampling

    def sample_round(self, step: int, round_index: int, policy: torch.nn.Module | None = None,
                     backend: RolloutBackend | None = None) -> tuple[Any, SampledRows]:
        """Generate G completions for each of this rank's prompts of the round, by ``backend`` from ``policy`` (None:
        the run's): (the rollout, its rows with rewards shaped)."""
        result = self.run.sample(backend or self.backend, step, round_index, policy)
        scores, loss_mask = shape_rewards(result, self.config.grpo, self.config.env.max_new_tokens)
        rows = SampledRows(result.prompt_ids, result.prompt_mask, result.response_ids, result.response_mask,
                           scores, loss_mask, result.process_rewards, result.process_step_mask,
                           getattr(result, "logprobs", None),  # a backend may return the env's RolloutResult as is
                           policy_token_mask(result))
        return result, rows

    def collect(self, step: int, policy: torch.nn.Module | None = None,
                backend: RolloutBackend | None = None) -> tuple[Batch | None, dict[str, float]]:
        """Generate rounds (by ``backend`` from ``policy``; None: the run's) until `prompts_per_step` groups with signal
        are kept over all ranks (or the round bound is hit). The batch holds this rank's kept rows; None when it kept
        none (another rank may have)."""
        g, r = self.config.grpo, self.config.rollout
        kept: list[SampledRows] = []
        sampled_scores, stats, kept_groups = [], {}, 0
        for round_index in range(g.max_sampling_rounds):
            result, rows = self.sample_round(step, round_index, policy, backend)
            if round_index == 0:
                stats = {**rollout_metrics(result, rows.scores), **episode_metrics(result)}
            sampled_scores.append(rows.scores)
            if g.dynamic_sampling:
                groups, kept_groups = first_groups(informative_groups(result, rows.loss_mask, g, r.group_size), kept_groups,
                                                   r.prompts_per_step)
                rows = rows.take(groups.repeat_interleave(r.group_size).nonzero().flatten())
            else:
                kept_groups = r.prompts_per_step
            if rows.scores.numel():
                kept.append(rows)
            if kept_groups >= r.prompts_per_step:
                break
        stats["zero_std_group_frac"] = zero_std_group_fraction(gather_rows(torch.cat(sampled_scores)), r.group_size)
        stats["generation_rounds"] = round_index + 1
        stats["kept_groups"] = kept_groups
        if kept_groups == 0:
            return None, stats
        advantages = outcome_advantages(kept, g, r.group_size)
        return (build_batch(kept, g, r.group_size, self.env.pad_id, advantages) if kept else None), stats

    # ------------------------------------------------------------ update

    def _logprobs(self, batch: Batch | None, rows: slice | None, reference: bool = False):
        """([n, T] log-probs, [n, T] entropy) of a micro-batch's rows under the policy (through the wrapped module)
        or the frozen reference. ``rows`` None: a zero-weight micro-batch (one row of two pad tokens), which a rank
        with fewer micro-batches runs so every rank makes as many passes."""
        inputs = micro_batch_inputs(batch.input_ids, batch.attention_mask, batch.prompt_width, rows, self.env.pad_id)
        options = dict(temperature=self.config.rollout.temperature, chunk_size=self.config.loss.logprob_chunk_size,
                       vocab_size=len(self.tokenizer))
        if reference:
            return self.run.reference(completion_logprobs, self.ref_model, *inputs, **options)
        return self.forward(completion_logprobs, self.model, *inputs, **options)

    def _micro_batch_rows(self, batch: Batch | None) -> int:
        """Rows per micro-batch of this update (algos/learn/micro_batches.py), probed on the policy's log-probs."""
        def policy_logprobs(rows: torch.Tensor):
            return completion_logprobs(self.model, batch.input_ids[rows], batch.attention_mask[rows], batch.prompt_width,
                                       self.config.rollout.temperature, self.config.loss.logprob_chunk_size,
                                       len(self.tokenizer))

        rows = None if batch is None else (batch.input_ids, batch.attention_mask, batch.prompt_width)
        return self.micro_batch_sizer.batch_rows(rows, policy_logprobs, self.model.parameters())

    def update(self, batch: Batch | None) -> dict[str, float]:
        """num_iterations optimizer steps over the batch (this rank's rows of it; None: none), micro-batched with exact
        gradient accumulation. Every rank calls it; normalisers and decisions are over all ranks."""
        g, world = self.config.grpo, self.run.world
        num_rows = batch.num_rows if batch is not None else 0
        mask = batch.loss_mask.float() if batch is not None else torch.zeros(0, 1, device=self.run.device)
        # Entropy is logged over every token the policy generated, not only the loss's: overlong filtering masks the
        # truncated rows, often the high-entropy ones, and the metric would read low. A multi-turn episode's tool
        # outputs and env messages are not the policy's (the policy mask).
        response_mask = batch.policy_mask.float() if batch is not None else mask
        # Global normalisers: each micro-batch divides by the whole batch's counts (every rank's), so the sum is the
        # full loss.
        num_tokens, num_seqs, response_tokens = sum_over_ranks(mask.sum().item(), (mask.sum(-1) > 0).sum().item(),
                                                               response_mask.sum().item())
        if num_tokens == 0:
            # Every row masked (e.g. all truncated under overlong filtering): a zero gradient, on which
            # AdamW's momentum and weight decay would still move the weights. No optimizer step.
            return {"skipped_update": 1.0, "lr": advance_schedule(self.scheduler)[0]}
        norms = {"global_num_tokens": num_tokens, "global_num_seqs": max(1.0, num_seqs),
                 "token_budget": self.config.env.max_new_tokens}
        size = self._micro_batch_rows(batch)
        micro = padded_micro_batches([slice(i, min(i + size, num_rows)) for i in range(0, num_rows, size)])
        with torch.no_grad():
            old_logp = self._pass_logprobs(batch, micro) if g.num_iterations > 1 else None
            ref_logp = self._pass_logprobs(batch, micro, reference=True) if self.ref_model else None

        totals: dict[str, float] = {}
        mismatch: dict[str, float] = {}
        inputs = _UpdateInputs(batch, mask, response_mask, old_logp, ref_logp, norms, mismatch)
        applied = 0
        for iteration in range(g.num_iterations):
            # Policy statistics describe the last iteration, where the ratio has moved away from 1.
            stats, entropy_sums = UpdateStats(), []
            micro_batch_loss = functools.partial(self._micro_batch_loss, inputs, stats=stats, entropy_sums=entropy_sums,
                                                 measure=iteration == 0)
            step = accumulate_and_step(micro, micro_batch_loss, forward=self.forward, device_type=self.run.device.type,
                                       modules=self.run.modules, optimizer=self.optimizer, scaler=self.scaler,
                                       max_grad_norm=self.config.optim.max_grad_norm, world_size=world.size)
            applied += step.applied
            totals["loss"] = step.loss
            totals["grad_norm"] = step.grad_norm
        # One skipped iteration (e.g. a float16 overflow) does not undo the others: the weights moved unless all were.
        totals["skipped_update"] = float(applied == 0)
        totals["skipped_iterations"] = g.num_iterations - applied
        lr = advance_schedule(self.scheduler)[0]
        totals.update(stats.over_ranks().means(num_tokens))
        totals["entropy"] = sum_over_ranks(sum(entropy_sums))[0] / max(1.0, response_tokens)
        totals.update(mismatch_metrics(mismatch, num_tokens, num_seqs))
        totals["lr"] = lr
        totals["micro_batch_rows"] = float(size)
        return totals

    def _micro_batch_loss(self, inputs: _UpdateInputs, rows: slice | None, *, stats: UpdateStats,
                          entropy_sums: list[float], measure: bool) -> torch.Tensor:
        """GRPO's loss of one micro-batch: the clipped surrogate (rollout-corrected), plus beta x KL to the reference,
        minus the entropy bonus, aggregated by the batch's global normalisers; its statistics go to ``stats`` and
        ``entropy_sums``. ``rows`` None: a zero-weight pass."""
        g, loss_cfg, batch = self.config.grpo, self.config.loss, inputs.batch
        logp, entropy = self._logprobs(batch, rows)
        if rows is None:
            return logp.sum() * 0.0
        m = inputs.mask[rows]
        # With one iteration the policy is pi_old itself: ratio 1, gradient of the plain surrogate.
        old = inputs.old_logp[rows] if inputs.old_logp is not None else logp.detach()
        out = POLICY_LOSSES[loss_cfg.surrogate](logp, old, batch.advantages[rows], m, loss_cfg.eps_low,
                                                loss_cfg.eps_high, loss_cfg.dual_clip)
        per_token = out.per_token_loss
        if batch.rollout_logp is not None:  # the mismatch is measured once per update (measure)
            per_token = per_token * correction_weights(self.rollout_correction, loss_cfg.rollout_correction_cap, old,
                                                       batch.rollout_logp[rows], m, inputs.mismatch if measure else None)
        if inputs.ref_logp is not None:
            kl = kl_estimate(logp, inputs.ref_logp[rows], g.kl_estimator, g.kl_clamp)
            per_token = per_token + g.beta * kl * m
            stats.add("kl", (kl.detach() * m).sum().item())
        if loss_cfg.entropy_coef:
            per_token = per_token - loss_cfg.entropy_coef * entropy * m
        entropy_sums.append((entropy.detach() * inputs.response_mask[rows]).sum().item())
        stats.add_surrogate(out.stats, m.sum().item())
        return aggregate_loss(per_token, m, loss_cfg.aggregation, **inputs.norms)

    def _pass_logprobs(self, batch: Batch | None, micro: list[slice | None], reference: bool = False) -> torch.Tensor | None:
        """[n, T] log-probs of this rank's rows, one micro-batch at a time (zero-weight ones run and are dropped)."""
        parts = [logp for rows in micro for logp in [self._logprobs(batch, rows, reference)[0]] if rows is not None]
        return torch.cat(parts) if parts else None

    # ------------------------------------------------------------ loop

    def save(self, step: int):
        return self.run.save(step, self.optimizer, self.scheduler, {"rollouts": self.rollouts.state(step)})

    def train_step(self, step: int, logger: MetricsLogger) -> dict[str, float]:
        batch, metrics = self.rollouts.batch_for(step)
        if metrics["kept_groups"] == 0:
            metrics["skipped_update"], metrics["lr"] = 1.0, advance_schedule(self.scheduler)[0]
            rounds = metrics["generation_rounds"]
            logger.write(f"step {step}: no group with reward variance after {rounds} rounds; update skipped")
        else:
            metrics.update(self.update(batch))
            if metrics["skipped_update"]:
                logger.write(f"step {step}: no loss tokens, or a non-finite loss or gradient; update skipped, weights unchanged")
            elif metrics["skipped_iterations"]:
                logger.write(f"step {step}: {metrics['skipped_iterations']} of {self.config.grpo.num_iterations} iterations "
                             "skipped (non-finite loss or gradient); the others were applied")
        self.rollouts.weights_after(step)
        return metrics

    def train(self) -> dict[str, Any]:
        return run_training(self)


def _check_process_rewards(config: GRPOConfig, task) -> None:
    if config.grpo.process_weight and task.process_step_end is None:
        raise ValueError(
            f"config grpo.process_weight = {config.grpo.process_weight} needs per-step process rewards, and task "
            f"{config.env.id} with env.kwargs {config.env.kwargs} gives none (Countdown does with step_reward > 0)"
        )


def train(config: GRPOConfig, *, resume: bool = False) -> dict[str, Any]:
    """Run GRPO/DAPO as configured; returns eval accuracy before/after and the plot path."""
    return GRPOTrainer(config, resume=resume).train()
