"""GRPO (DeepSeekMath) and DAPO in one loop over algos.core.

One step: sample G completions for each of `prompts_per_step` prompts by stepping a
TokenVectorEnv; shape rewards (DAPO soft overlong penalty); keep groups with signal
(DAPO dynamic sampling, bounded rounds); group-normalised advantages (plus, with
`grpo.process_weight`, DeepSeekMath process supervision from the task's step rewards); then
`num_iterations` clipped-surrogate updates over micro-batches with gradient
accumulation, KL to a frozen reference when beta > 0. DAPO is the `dapo` preset
(algos.config.DAPO_PRESET); each of its parts is a switch in the `grpo` section.

Dynamic sampling bound: at most `max_sampling_rounds` generation rounds per step.
A group is informative when its task scores (accuracy, before the soft overlong penalty)
differ, or with process supervision its step rewards do, and at least one of its rows is
trained on. When the bound is hit with fewer than
`prompts_per_step` informative groups, the step trains on the groups it has (the loss
normalisers count only those); with none, the update is skipped and logged as
`skipped_update = 1`, as it is when every kept row's loss is masked (overlong filtering).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import rewards
from algos import checkpoint as ckpt
from algos.config import DAPO_PRESET, GRPOConfig
from algos.core.advantages import group_advantages, process_advantages, step_rewards_vary, zero_std_group_fraction
from algos.core.aggregation import aggregate_loss
from algos.core.kl import kl_estimate
from algos.core.policy_loss import clipped_policy_loss
from algos.metrics import MetricsLogger
from algos.rollout import RolloutBackend
from algos.trainer import (
    DTYPES,
    advance_schedule,
    build_optimizer,
    build_scheduler,
    build_task,
    check_lm_head,
    completion_logprobs,
    eval_task,
    evaluate,
    grad_scaler,
    guarded_optimizer_step,
    make_env,
    make_rollout_backend,
    open_run_dir,
    resolve_device,
    rollout_metrics,
    run_training,
    seed_everything,
    task_accuracy,
    warn_if_eval_reads_training_data,
)

Config = GRPOConfig
PRESETS = {"dapo": DAPO_PRESET}


@dataclass
class Batch:
    """The rows one step trains on: [N, P+T] ids/mask, [N, T] loss mask, [N] scores, and [N] advantages
    ([N, T] with process supervision)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_width: int
    loss_mask: torch.Tensor
    scores: torch.Tensor
    advantages: torch.Tensor

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]


def _right_pad_cat(parts: list[torch.Tensor], width: int) -> torch.Tensor:
    """[n_k, T_k] parts -> [sum n_k, width], zero-padded on the right."""
    return torch.cat([torch.nn.functional.pad(part, (0, width - part.shape[1])) for part in parts])


def _pad_and_concat(parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]], pad_id: int):
    """[(prompt_ids [n,P_k], prompt_mask, response_ids [n,T_k], response_mask)] -> left/right padded concatenation."""
    width_p = max(p.shape[1] for p, _, _, _ in parts)
    width_t = max(r.shape[1] for _, _, r, _ in parts)
    ids, masks = [], []
    for prompt, prompt_mask, response, response_mask in parts:
        left, right = width_p - prompt.shape[1], width_t - response.shape[1]
        ids.append(torch.nn.functional.pad(torch.cat([prompt, response], 1), (left, right), value=pad_id))
        masks.append(torch.nn.functional.pad(torch.cat([prompt_mask, response_mask], 1), (left, right)))
    return torch.cat(ids), torch.cat(masks), width_p, _right_pad_cat([mask for *_, mask in parts], width_t)


class GRPOTrainer:
    def __init__(self, config: GRPOConfig, *, resume: bool = False, backend: RolloutBackend | None = None) -> None:
        """``backend``: the rollout backend (default: the one config.rollout names), e.g. a ScriptedRollout."""
        from algos.models import load_policy

        config.validate()
        g = config.grpo
        # Built before open_run_dir writes config.yaml, so a refused task or config leaves no run behind;
        # the evaluation set once, as a dataset's file is read once.
        task, self.eval_set = build_task(config), eval_task(config)
        if g.process_weight and task.process_step_end is None:
            raise ValueError(
                f"config grpo.process_weight = {g.process_weight} needs per-step process rewards, and task "
                f"{config.env.id} with env.kwargs {config.env.kwargs} gives none (Countdown does with step_reward > 0)"
            )
        self.config = config
        seed_everything(config.run.seed, config.run.full_determinism)
        self.device = resolve_device(config.model.device)
        self.model, self.tokenizer = load_policy(config.model.path, dtype=DTYPES[config.model.dtype], device=self.device)
        check_lm_head(self.model, len(self.tokenizer))
        # After the model's own checks: a refused model leaves no run behind (and deletes no old one).
        self.output_dir = Path(config.run.output_dir)
        latest = open_run_dir(config, resume)
        # The frozen reference exists only when the KL term does: beta = 0 costs no memory.
        self.ref_model = None
        if config.grpo.beta > 0:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = build_optimizer(self.model, config.optim)
        self.scheduler = build_scheduler(self.optimizer, config.optim, config.run.steps)
        self.scaler = grad_scaler(config.model, self.device)
        self.env = make_env(config, self.tokenizer, num_envs=g.prompts_per_step * g.group_size, device=self.device,
                            task=task, model=self.model)
        warn_if_eval_reads_training_data(config, self.env.task)
        self.backend = backend if backend is not None else make_rollout_backend(config)
        self.start_step = 0
        if latest is not None:
            loaded = ckpt.load_checkpoint(latest, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler)
            self.scaler.load_state_dict(loaded["state"].get("grad_scaler", {}))
            self.start_step = loaded["step"]

    # ------------------------------------------------------------ sampling

    def _round_seed(self, step: int, round_index: int) -> int:
        """The data position is a pure function of (seed, step, round), so a resumed run sees the same prompts
        (distinct for every round: grpo.max_sampling_rounds <= 101)."""
        return (self.config.run.seed * 1_000_003 + step) * 101 + round_index

    def collect(self, step: int) -> tuple[Batch | None, dict[str, float]]:
        """Generate rounds until `prompts_per_step` groups with signal are kept (or the round bound is hit)."""
        g, max_len = self.config.grpo, self.config.env.max_new_tokens
        kept_parts, kept_scores, kept_masks, kept_step_rewards, kept_step_masks = [], [], [], [], []
        first_round: dict[str, float] = {}
        sampled_scores = []
        rounds = 0
        while sum(s.shape[0] for s in kept_scores) < g.prompts_per_step * g.group_size and rounds < g.max_sampling_rounds:
            self.env.reset(seed=self._round_seed(step, rounds), options={"group_size": g.group_size})
            result = self.backend.generate(self.model, self.env)
            rounds += 1
            lengths = result.response_mask.sum(-1)
            scores = result.scores.float().clone()
            if g.soft_overlong:
                scores += g.overlong_penalty_factor * torch.tensor(
                    [rewards.soft_overlong_penalty(int(n), max_len, g.overlong_cache) for n in lengths.tolist()],
                    device=scores.device,
                )
            loss_mask = result.response_mask.clone()
            if g.overlong_filter:
                keep = rewards.overlong_filter_mask(lengths.tolist(), max_len, truncated=result.truncated.tolist())
                loss_mask *= torch.tensor(keep, device=loss_mask.device, dtype=loss_mask.dtype).unsqueeze(-1)
            if rounds == 1:
                first_round = rollout_metrics(result, scores)
            sampled_scores.append(scores)
            # DAPO keeps a group when its accuracy (or, as configured, its task score; either before the length
            # penalty) varies and some row of it is trained on (overlong filtering may mask them all). With
            # process supervision, step rewards that differ within the group are a signal too.
            metric = task_accuracy(result) if g.dynamic_sampling_metric == "acc" else result.scores.float()
            metric = metric.reshape(-1, g.group_size)
            varies = metric.amax(1) > metric.amin(1)
            if g.process_weight:
                varies |= step_rewards_vary(result.process_rewards, result.process_step_mask, g.group_size)
            trained = loss_mask.any(-1).reshape(-1, g.group_size).any(1)
            informative = varies & trained
            groups = informative if g.dynamic_sampling else torch.ones_like(informative)
            rows = groups.repeat_interleave(g.group_size).nonzero().flatten()
            if rows.numel():
                kept_parts.append(
                    (self.env.prompt_ids[rows], self.env.prompt_mask[rows], result.response_ids[rows], result.response_mask[rows])
                )
                kept_scores.append(scores[rows])
                kept_masks.append(loss_mask[rows])
                kept_step_rewards.append(result.process_rewards[rows])
                kept_step_masks.append(result.process_step_mask[rows])
            if not g.dynamic_sampling:
                break
        all_sampled = torch.cat(sampled_scores)
        stats = {
            **first_round,
            "zero_std_group_frac": zero_std_group_fraction(all_sampled, g.group_size),
            "generation_rounds": rounds,
        }
        if not kept_parts:
            stats["kept_groups"] = 0
            return None, stats
        limit = g.prompts_per_step * g.group_size  # extra informative groups of the last round are dropped
        input_ids, attention_mask, prompt_width, _ = _pad_and_concat(kept_parts, self.env.pad_id)
        width_t = input_ids.shape[1] - prompt_width
        loss_mask = _right_pad_cat(kept_masks, width_t)
        scores = torch.cat(kept_scores)[:limit]
        stats["kept_groups"] = scores.shape[0] // g.group_size
        advantages = group_advantages(scores, g.group_size, scale=g.adv_scale, eps=g.adv_eps)
        if g.process_weight:
            step_rewards = _right_pad_cat(kept_step_rewards, width_t)[:limit]
            step_mask = _right_pad_cat(kept_step_masks, width_t)[:limit]
            advantages = advantages.unsqueeze(-1) + g.process_weight * process_advantages(
                step_rewards, step_mask, g.group_size, eps=g.adv_eps
            )
        batch = Batch(
            input_ids=input_ids[:limit],
            attention_mask=attention_mask[:limit],
            prompt_width=prompt_width,
            loss_mask=loss_mask[:limit],
            scores=scores,
            advantages=advantages,
        )
        return batch, stats

    # ------------------------------------------------------------ update

    def _logprobs(self, model: torch.nn.Module, batch: Batch, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        return completion_logprobs(
            model,
            batch.input_ids[rows],
            batch.attention_mask[rows],
            batch.prompt_width,
            temperature=self.config.rollout.temperature,
            chunk_size=self.config.grpo.logprob_chunk_size,
            vocab_size=len(self.tokenizer),
        )

    def update(self, batch: Batch) -> dict[str, float]:
        """num_iterations optimizer steps over the batch, micro-batched with exact gradient accumulation."""
        g = self.config.grpo
        if not batch.loss_mask.any():
            # Every row masked (e.g. all truncated under overlong filtering): a zero gradient, on which
            # AdamW's momentum and weight decay would still move the weights. No optimizer step.
            return {"skipped_update": 1.0, "lr": advance_schedule(self.scheduler)[0]}
        micro = [slice(i, min(i + g.micro_batch_size, batch.num_rows)) for i in range(0, batch.num_rows, g.micro_batch_size)]
        mask = batch.loss_mask.float()
        # Entropy is logged over every generated token, not only the loss's: overlong filtering masks the truncated
        # rows, often the high-entropy ones, and the metric would read low.
        response_mask = batch.attention_mask[:, batch.prompt_width :].float()
        # Global normalisers: each micro-batch divides by the whole batch's counts, so the sum is the full loss.
        norms = {
            "global_num_tokens": mask.sum().clamp(min=1).item(),
            "global_num_seqs": max(1, int((mask.sum(-1) > 0).sum())),
            "token_budget": self.config.env.max_new_tokens,
        }
        with torch.no_grad():
            old_logp = torch.cat([self._logprobs(self.model, batch, s)[0] for s in micro]) if g.num_iterations > 1 else None
            ref_logp = torch.cat([self._logprobs(self.ref_model, batch, s)[0] for s in micro]) if self.ref_model else None

        totals: dict[str, float] = {}
        applied = 0
        for _ in range(g.num_iterations):
            # Policy statistics describe the last iteration, where the ratio has moved away from 1.
            stat_sums: dict[str, float] = {}
            ratio_min, ratio_max = math.inf, -math.inf
            loss_total, entropy_sum, finite = 0.0, 0.0, True
            for rows in micro:
                logp, entropy = self._logprobs(self.model, batch, rows)
                m = mask[rows]
                # With one iteration the policy is pi_old itself: ratio 1, gradient of the plain surrogate.
                old = old_logp[rows] if old_logp is not None else logp.detach()
                out = clipped_policy_loss(
                    logp, old, batch.advantages[rows], m, g.eps_low, g.eps_high, g.dual_clip, g.ratio_level
                )
                per_token = out.per_token_loss
                if ref_logp is not None:
                    kl = kl_estimate(logp, ref_logp[rows], g.kl_estimator, g.kl_clamp)
                    per_token = per_token + g.beta * kl * m
                    stat_sums["kl"] = stat_sums.get("kl", 0.0) + (kl.detach() * m).sum().item()
                if g.entropy_coef:
                    per_token = per_token - g.entropy_coef * entropy * m
                loss = aggregate_loss(per_token, m, g.loss_agg, **norms)
                if not torch.isfinite(loss):
                    finite = False  # the whole update is skipped below; no NaN reaches the weights
                    continue
                self.scaler.scale(loss).backward()
                loss_total += loss.item()
                tokens = m.sum().item()
                entropy_sum += (entropy.detach() * response_mask[rows]).sum().item()
                for key in ("clip_frac_low", "clip_frac_high", "dual_clip_frac", "ratio_mean"):
                    stat_sums[key] = stat_sums.get(key, 0.0) + out.stats[key] * tokens
                ratio_min, ratio_max = min(ratio_min, out.stats["ratio_min"]), max(ratio_max, out.stats["ratio_max"])
            outcome = guarded_optimizer_step(self.model, self.optimizer, self.config.optim.max_grad_norm, finite, self.scaler)
            applied += outcome.applied
            totals["loss"] = loss_total if finite else math.nan
            totals["grad_norm"] = outcome.grad_norm
        # One skipped iteration (e.g. a float16 overflow) does not undo the others: the weights moved unless all were.
        totals["skipped_update"] = float(applied == 0)
        totals["skipped_iterations"] = g.num_iterations - applied
        lr = advance_schedule(self.scheduler)[0]
        n_tokens = norms["global_num_tokens"]
        totals.update({k: v / n_tokens for k, v in stat_sums.items()})
        totals["entropy"] = entropy_sum / response_mask.sum().clamp(min=1).item()
        totals.update({"ratio_min": ratio_min, "ratio_max": ratio_max, "lr": lr})
        return totals

    # ------------------------------------------------------------ loop

    def evaluate(self) -> float:
        return evaluate(self.model, self.tokenizer, self.config, self.backend, device=self.device, eval_set=self.eval_set)

    def save(self, step: int) -> Path:
        return ckpt.save_checkpoint(
            self.output_dir, step, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
            tokenizer=self.tokenizer, state={"grad_scaler": self.scaler.state_dict()}, keep_last=self.config.run.keep_last, config=self.config,
        )

    def train_step(self, step: int, logger: MetricsLogger) -> dict[str, float]:
        batch, metrics = self.collect(step)
        if batch is None:
            metrics["skipped_update"], metrics["lr"] = 1.0, advance_schedule(self.scheduler)[0]
            logger.write(f"step {step}: no group with reward variance after {metrics['generation_rounds']} rounds; update skipped")
        else:
            metrics.update(self.update(batch))
            if metrics["skipped_update"]:
                logger.write(f"step {step}: no loss tokens, or a non-finite loss or gradient; update skipped, weights unchanged")
            elif metrics["skipped_iterations"]:
                logger.write(f"step {step}: {metrics['skipped_iterations']} of {self.config.grpo.num_iterations} iterations "
                             "skipped (non-finite loss or gradient); the others were applied")
        return metrics

    def train(self) -> dict[str, Any]:
        return run_training(self)


def train(config: GRPOConfig, *, resume: bool = False) -> dict[str, Any]:
    """Run GRPO/DAPO as configured; returns eval accuracy before/after and the plot path."""
    return GRPOTrainer(config, resume=resume).train()
