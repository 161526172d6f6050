"""GRPO, DAPO (each part), Dr. GRPO, GSPO and process supervision, pinned end to end: a ScriptedRollout feeds the
trainer a fixed set of completions with the awkward cases in it (uneven prompt and completion lengths, a group
without signal, a group whose every row is truncated, rows cut at the token budget, micro-batches that do not
divide the batch, a second dynamic-sampling round with more groups than the step needs), and at every optimizer
step the gradient the trainer applies must equal the gradient of the objective written from the papers below,
in unpadded, unchunked, full-batch torch (tests/reference_helpers.py), as must the metrics it logs.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from reference_helpers import (
    OptimizerSpy,
    Row,
    assert_gradients_equal,
    clip_surrogate,
    clipped_gradients,
    load_weights,
    lr_factor,
    model_gradients,
    rows_of_round,
    save_tiny_model,
    token_logprobs,
)

from algos.algorithms.grpo import PRESETS, GRPOConfig, GRPOTrainer
from algos.config import load_config
from algos.rollout import ScriptedRollout
from algos.run.reporting import MetricsLogger

TASK = '{"num_numbers": 3, "step_reward": 0.1, "prompt_template": "{numbers}>{target}:"}'
MAX_NEW_TOKENS = 24


def _completion(kind: str, problem) -> str:
    a, b, _ = problem.answer["numbers"]
    right = f"\\boxed{{{problem.metadata['solution']}}}"
    return {
        "right": right,
        "wrong": "\\boxed{0}",
        "work": f"{a} + {b} = {a + b}\n\\boxed{{0}}",  # a valid line of working (a process reward), then a wrong answer
        "long": "9" * 40,  # cut at the token budget: truncated and wrong
        "long_right": right + " " * 40,  # truncated, yet its boxed answer is right
        "empty": "",  # the stop token alone: one generated token
    }[kind]


# Even rounds, then odd rounds: [group][row] kinds. Round 0's group 1 has no signal (every row wrong, one of them a
# single token) and its group 2 is all truncated (no loss token under overlong filtering); round 1's group 1 is all
# right. DAPO (accuracy) so keeps one group, then two: exactly the three it needs. Filtering on the score, without
# overlong filtering, it keeps two, then two: one more than it needs.
SCRIPT = (
    [["right", "wrong", "work", "long"], ["wrong", "wrong", "empty", "wrong"], ["long_right", "long", "long_right", "long"]],
    [["right", "work", "wrong", "right"], ["right", "right", "right", "right"], ["right", "right", "wrong", "long"]],
)
# Every row truncated but one, which is the stop token alone: one loss token in the batch under overlong filtering,
# with a non-zero advantage (its group's truncated second row is right).
ONE_LOSS_TOKEN = ([["empty", "long_right", "long", "long"], ["long"] * 4, ["long"] * 4],)


def scripted(rounds):
    def script(problem, row: int, round_index: int) -> str:
        return _completion(rounds[round_index % len(rounds)][row // 4][row % 4], problem)

    return script


script = scripted(SCRIPT)


BASE = {
    "model.autocast": "null",  # fp32 on every machine: the references are fp32 hand computations
    "model.device": "cpu",  # where the references compute (on a GPU host the trainer's tensors would live on cuda:0)
    "env.id": "rlvr/Countdown-v0", "env.kwargs": TASK, "env.max_new_tokens": str(MAX_NEW_TOKENS),
    "env.use_chat_template": "false", "env.eval_size": "4", "run.progress": "false", "run.tensorboard": "false",
    "run.plots": "false", "rollout.prompts_per_step": "3", "rollout.group_size": "4", "loss.micro_batch_size": "5",
    "optim.lr": "0.02", "grpo.overlong_cache": "8", "run.steps": "1",
}

SCENARIOS = {
    # DeepSeekMath GRPO with every term on: two iterations (the ratio moves and clips), k3 KL to the reference,
    # an entropy bonus, a sampling temperature, warm-up then cosine decay over three steps.
    "grpo": {"grpo.num_iterations": "2", "grpo.beta": "0.04", "loss.entropy_coef": "0.01", "rollout.temperature": "0.7",
             "optim.warmup_steps": "1", "optim.schedule": "cosine", "run.steps": "3"},
    # DAPO: clip-higher, dynamic sampling (two rounds, trimmed), token-mean, overlong filter and soft penalty, no KL.
    "dapo": {"preset": "dapo", "grpo.num_iterations": "2", "optim.schedule": "linear", "run.steps": "2"},
    # Each DAPO part alone on top of GRPO.
    "clip_higher": {"loss.eps_high": "0.28", "grpo.num_iterations": "2", "grpo.beta": "0"},
    "dynamic_sampling": {"grpo.dynamic_sampling": "true", "grpo.beta": "0", "grpo.dynamic_sampling_metric": "score"},
    "token_mean": {"loss.aggregation": "token-mean", "grpo.beta": "0"},
    "overlong_filter": {"grpo.overlong_filter": "true", "grpo.beta": "0"},
    "soft_overlong": {"grpo.soft_overlong": "true", "grpo.overlong_penalty_factor": "0.7", "grpo.beta": "0"},
    # Dr. GRPO: mean-only advantages, a constant token budget; here with the k2 KL, clamped tight.
    "dr_grpo": {"grpo.adv_estimator": "dr-grpo", "loss.aggregation": "seq-mean-token-sum-norm", "grpo.kl_estimator": "k2",
                "grpo.kl_clamp": "0.001", "grpo.num_iterations": "2"},
    # GSPO: one clipped, length-normalised ratio per sequence.
    "gspo": {"loss.surrogate": "gspo", "grpo.num_iterations": "2", "loss.eps_low": "0.05", "loss.eps_high": "0.05",
             "grpo.beta": "0"},
    # RLOO: each row's baseline is the mean of the other rows of its group.
    "rloo": {"preset": "rloo", "grpo.num_iterations": "2"},
    # CISPO: the clipped weight is detached, so clipped tokens keep their gradient; a tight clip so it binds.
    "cispo": {"preset": "cispo", "loss.eps_low": "0.05", "loss.eps_high": "0.05"},
    # GMPO: the geometric mean of log-space-clipped token ratios, one loss per row; a tight clip so it binds.
    "gmpo": {"preset": "gmpo", "loss.eps_low": "0.05", "loss.eps_high": "0.05"},
    # Process supervision beside the outcome advantage, batch-std scaling, dual clip.
    "process": {"grpo.process_weight": "0.5", "grpo.adv_estimator": "batch-std", "loss.dual_clip": "1.5",
                "grpo.num_iterations": "2", "grpo.beta": "0", "optim.lr": "0.05", "grpo.adv_eps": "0.1"},
    # Dynamic sampling keeps a group whose step rewards are all equal when its accuracy varies (round 0's group 2).
    "process_dynamic": {"grpo.process_weight": "0.5", "grpo.dynamic_sampling": "true", "grpo.beta": "0"},
    # The normalisers at their edge: one loss token in the batch (token-mean), one row with loss tokens (per sequence).
    "one_loss_token": {"script": ONE_LOSS_TOKEN, "grpo.overlong_filter": "true", "loss.aggregation": "token-mean",
                       "grpo.beta": "0"},
    "one_loss_row": {"script": ONE_LOSS_TOKEN, "grpo.overlong_filter": "true", "grpo.beta": "0"},
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def make_trainer(model_dir, output_dir, scenario: dict) -> GRPOTrainer:
    scenario = dict(scenario)
    preset = PRESETS.get(scenario.pop("preset", None))
    rounds = scenario.pop("script", SCRIPT)
    overrides = {**BASE, "model.path": model_dir, "run.output_dir": str(output_dir), **scenario}
    return GRPOTrainer(load_config(GRPOConfig, overrides=overrides, preset=preset), backend=ScriptedRollout(scripted(rounds)))


# ---------------------------------------------------------------- the reference, from the papers


def soft_overlong_penalty(length: int, max_len: int, cache: int) -> float:
    """DAPO's R_length."""
    if length <= max_len - cache:
        return 0.0
    if length <= max_len:
        return ((max_len - cache) - length) / cache
    return -1.0


def process_advantages_of_group(group: list[Row], eps: float) -> list[torch.Tensor]:
    """DeepSeekMath process supervision: step rewards normalised over every step of the group; token t gets the
    sum of the normalised rewards of the steps that end at or after it."""
    rewards = torch.cat([row.step_rewards[row.step_mask] for row in group])
    mean = rewards.mean() if rewards.numel() else torch.tensor(0.0)
    std = rewards.std() if rewards.numel() > 1 else torch.tensor(0.0)
    advantages = []
    for row in group:
        normalised = torch.where(row.step_mask, (row.step_rewards - mean) / (std + eps), 0.0)
        advantages.append(normalised.flip(0).cumsum(0).flip(0))
    return advantages


def reference_batch(rounds, g, sampling, max_new_tokens: int):
    """The rows a GRPO/DAPO step trains on (``g`` the grpo section, ``sampling`` the rollout one), in order, with their
    loss masks and advantages, and how many generation rounds it must have drawn."""
    groups, rounds_needed = [], 0
    for rollout in rounds:
        rounds_needed += 1
        rows = rows_of_round(rollout)
        for start in range(0, len(rows), sampling.group_size):
            group = rows[start : start + sampling.group_size]
            scores = [row.score + (g.overlong_penalty_factor * soft_overlong_penalty(row.length, max_new_tokens, g.overlong_cache)
                                   if g.soft_overlong else 0.0) for row in group]
            masks = [torch.full((row.length,), 0.0 if g.overlong_filter and row.truncated else 1.0) for row in group]
            signal = [row.correct >= 1 for row in group] if g.dynamic_sampling_metric == "acc" else [row.score for row in group]
            varies = max(signal) > min(signal)
            if g.process_weight:
                steps = torch.cat([row.step_rewards[row.step_mask] for row in group])
                varies = varies or (steps.numel() > 0 and steps.max() > steps.min())
            trained = any(mask.sum() > 0 for mask in masks)
            if not g.dynamic_sampling or (varies and trained):
                groups.append((group, scores, masks))
        if not g.dynamic_sampling or len(groups) >= sampling.prompts_per_step:
            break
    groups = groups[: sampling.prompts_per_step]  # the last round's extra groups are dropped
    all_scores = torch.tensor([s for _, scores, _ in groups for s in scores])
    kept = []
    for group, scores, masks in groups:
        scores = torch.tensor(scores)
        centred = scores - scores.mean()
        if g.adv_estimator == "grpo":
            outcome = centred / (scores.std() + g.adv_eps)
        elif g.adv_estimator == "batch-std":
            outcome = centred / (all_scores.std() + g.adv_eps)
        elif g.adv_estimator == "dr-grpo":
            outcome = centred
        elif g.adv_estimator == "rloo":  # RLOO: each row against the mean of the group's other rows
            outcome = scores - (scores.sum() - scores) / (len(scores) - 1)
        else:
            raise NotImplementedError(f"no reference for grpo.adv_estimator {g.adv_estimator!r}: write it from its paper here")
        process = process_advantages_of_group(group, g.adv_eps) if g.process_weight else None
        for i, row in enumerate(group):
            advantage = outcome[i] + (g.process_weight * process[i] if process else torch.zeros(row.length))
            kept.append((row, scores[i].item(), masks[i], advantage))
    return kept, rounds_needed


def reference_objective(model, old_model, ref_model, kept, g, lc, temperature: float, max_new_tokens: int):
    """J to minimise: per token -min(r A, clip(r) A) + beta KL - entropy_coef H over the loss mask, aggregated as
    lc.aggregation says over the whole batch; and the statistics the trainer logs."""
    per_row, stats = [], {"kl": 0.0, "clip_frac_low": 0.0, "clip_frac_high": 0.0, "dual_clip_frac": 0.0}
    ratios, entropy_sum, generated = [], 0.0, 0
    for row, _, mask, advantage in kept:
        logp, entropy = token_logprobs(model, row, temperature)
        with torch.no_grad():
            old = token_logprobs(old_model, row, temperature)[0] if old_model is not None else logp.detach()
        log_ratio = logp - old
        if lc.surrogate == "gspo":  # GSPO: exp of the mean token log-ratio over the row's own tokens
            log_ratio = ((log_ratio * mask).sum() / mask.sum().clamp(min=1)).expand_as(logp)
        ratio = log_ratio.exp()
        if lc.surrogate == "cispo":  # CISPO: -sg(clip(r)) A log pi
            loss = -ratio.detach().clamp(1 - lc.eps_low, 1 + lc.eps_high) * advantage * logp
        elif lc.surrogate == "gmpo":  # GMPO: -A exp(mean_t of log r_t clipped for A's sign), over the row's tokens
            bounded = log_ratio.clamp(max=lc.eps_high) if advantage[0] > 0 else log_ratio.clamp(min=-lc.eps_low)
            loss = (-advantage * ((bounded * mask).sum() / mask.sum().clamp(min=1)).exp()).expand_as(logp)
        else:
            loss = clip_surrogate(ratio, advantage, lc.eps_low, lc.eps_high, lc.dual_clip)
        if g.beta:
            with torch.no_grad():
                ref = token_logprobs(ref_model, row, temperature)[0]
            log_ref_ratio = ref - logp
            kl = {"k1": -log_ref_ratio, "k2": 0.5 * log_ref_ratio**2,
                  "k3": log_ref_ratio.exp() - log_ref_ratio - 1}[g.kl_estimator]
            kl = kl.clamp(-g.kl_clamp, g.kl_clamp)  # as verl: one far off-policy token cannot dominate
            loss = loss + g.beta * kl
            stats["kl"] += (kl.detach() * mask).sum().item()
        loss = loss - lc.entropy_coef * entropy
        per_row.append((loss * mask).sum())
        valid = mask > 0
        with torch.no_grad():
            unbounded = clip_surrogate(ratio, advantage, lc.eps_low, lc.eps_high)
            if lc.surrogate == "cispo":  # the weight is clipped whatever the sign of A
                stats["clip_frac_low"] += ((ratio < 1 - lc.eps_low) & valid).sum().item()
                stats["clip_frac_high"] += ((ratio > 1 + lc.eps_high) & valid).sum().item()
            elif lc.surrogate == "gmpo":  # PPO's rule in log space
                stats["clip_frac_low"] += ((log_ratio < -lc.eps_low) & (advantage < 0) & valid).sum().item()
                stats["clip_frac_high"] += ((log_ratio > lc.eps_high) & (advantage > 0) & valid).sum().item()
            else:
                stats["clip_frac_low"] += ((ratio < 1 - lc.eps_low) & (advantage < 0) & valid).sum().item()
                stats["clip_frac_high"] += ((ratio > 1 + lc.eps_high) & (advantage > 0) & valid).sum().item()
            if lc.dual_clip is not None:
                stats["dual_clip_frac"] += ((advantage < 0) & (unbounded > -lc.dual_clip * advantage) & valid).sum().item()
        ratios.append(ratio.detach()[valid])
        entropy_sum += entropy.detach().sum().item()
        generated += row.length
    tokens = [mask.sum() for _, _, mask, _ in kept]
    num_tokens = max(1.0, sum(tokens).item())
    num_seqs = max(1, sum(int(t > 0) for t in tokens))
    if lc.aggregation == "token-mean":
        objective = sum(per_row) / num_tokens
    elif lc.aggregation == "seq-mean-token-mean":
        objective = sum(loss / t.clamp(min=1) for loss, t in zip(per_row, tokens)) / num_seqs
    else:  # seq-mean-token-sum-norm
        objective = sum(per_row) / max_new_tokens / num_seqs
    stats = {key: value / num_tokens for key, value in stats.items()}
    ratios = torch.cat(ratios)
    stats.update({"ratio_mean": ratios.mean().item(), "ratio_min": ratios.min().item(), "ratio_max": ratios.max().item(),
                  "entropy": entropy_sum / generated, "loss": objective.item()})
    if not g.beta:
        del stats["kl"]
    return objective, stats


# ---------------------------------------------------------------- the tests


def batch_rows(batch) -> list[tuple[list[int], list[int]]]:
    """The trainer's batch as (prompt, completion) token lists without padding."""
    prompt = batch.input_ids[:, : batch.prompt_width]
    prompt_mask = batch.attention_mask[:, : batch.prompt_width].bool()
    response = batch.input_ids[:, batch.prompt_width :]
    response_mask = batch.attention_mask[:, batch.prompt_width :].bool()
    return [(p[pm].tolist(), r[rm].tolist()) for p, pm, r, rm in zip(prompt, prompt_mask, response, response_mask)]


@pytest.mark.parametrize("name", SCENARIOS)
def test_each_update_applies_the_gradient_of_the_papers_objective(name, model_dir, tmp_path):
    trainer = make_trainer(model_dir, tmp_path, SCENARIOS[name])
    config, g = trainer.config, trainer.config.grpo
    initial = copy.deepcopy(trainer.model)  # the KL reference, and a model to load recorded weights into
    spy = OptimizerSpy(trainer.optimizer, {"": trainer.model})
    logger = MetricsLogger(tmp_path, config.run.steps, tensorboard=False, progress=False)
    collected = []
    trainer_collect = trainer.collect

    def collect(step):
        batch, stats = trainer_collect(step)
        collected.append(batch)
        return batch, stats

    trainer.collect = collect
    clipped_low = clipped_high = dual_clipped = False
    for step in range(1, config.run.steps + 1):
        rounds_before, steps_before = len(trainer.backend.rounds), len(spy.steps)
        metrics = trainer.train_step(step, logger)
        kept, rounds_needed = reference_batch(trainer.backend.rounds[rounds_before:], g, config.rollout, MAX_NEW_TOKENS)
        assert len(trainer.backend.rounds) - rounds_before == rounds_needed
        batch = collected[-1]
        assert batch_rows(batch) == [(row.prompt.tolist(), row.response.tolist()) for row, *_ in kept]
        torch.testing.assert_close(batch.scores, torch.tensor([score for _, score, _, _ in kept]))
        iterations = spy.steps[steps_before:]
        assert len(iterations) == g.num_iterations
        old_model = load_weights(initial, iterations[0]["weights"]) if g.num_iterations > 1 else None
        for record in iterations:
            model = load_weights(initial, record["weights"])
            objective, stats = reference_objective(model, old_model, initial, kept, g, config.loss, config.rollout.temperature,
                                                   MAX_NEW_TOKENS)
            objective.backward()
            grads, norm = clipped_gradients(model_gradients(model), config.optim.max_grad_norm)
            assert_gradients_equal(record["grads"], grads)
            want_lr = config.optim.lr * lr_factor(step - 1, config.optim.warmup_steps, config.optim.schedule, config.run.steps)
            assert record["lr"] == [pytest.approx(want_lr, rel=1e-6)]
        # The logged statistics are the last iteration's.
        assert metrics["grad_norm"] == pytest.approx(norm, rel=1e-4)
        for key, value in stats.items():
            assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
        clipped_low |= stats["clip_frac_low"] > 0
        clipped_high |= stats["clip_frac_high"] > 0
        dual_clipped |= stats["dual_clip_frac"] > 0
    # The second iteration's ratios left the clip range on both sides: the clipping was exercised, as was the dual clip.
    if g.num_iterations > 1:
        assert clipped_low and clipped_high
    assert dual_clipped == (config.loss.dual_clip is not None)


def test_dapo_collect_keeps_informative_trained_groups_and_stops_when_full(model_dir, tmp_path):
    """DAPO's dynamic sampling on SCRIPT, by hand: round 0 keeps group 0 only (group 1 is all wrong, group 2's rows are
    all truncated, so overlong filtering leaves it no loss token); round 1 keeps groups 0 and 2 (group 1 is all
    right): three groups, exactly enough, so no third round is drawn."""
    trainer = make_trainer(model_dir, tmp_path, SCENARIOS["dapo"])
    batch, stats = trainer.collect(step=1)
    assert (stats["generation_rounds"], stats["kept_groups"]) == (2, 3)
    assert stats["zero_std_group_frac"] == pytest.approx(2 / 6)  # round 0's group 1, round 1's group 1
    sampled = [rows_of_round(r) for r in trainer.backend.rounds]
    expected = sampled[0][0:4] + sampled[1][0:4] + sampled[1][8:12]
    assert batch_rows(batch) == [(row.prompt.tolist(), row.response.tolist()) for row in expected]
    # Loss masks: the truncated rows ("long") get none; every other generated token counts.
    kinds = SCRIPT[0][0] + SCRIPT[1][0] + SCRIPT[1][2]
    assert [bool(m.any()) for m in batch.loss_mask] == [kind != "long" for kind in kinds]
    # Advantages of round 1's group 2 [right, right, wrong, long] from its shaped scores: the right answers and the
    # truncated row pay the soft overlong penalty (L_max 24, L_cache 8, grpo.overlong_penalty_factor's default 0.5).
    lengths = [row.length for row in expected[8:]]
    assert lengths[3] == MAX_NEW_TOKENS
    penalties = [max(-1.0, min(0.0, (16 - n) / 8)) for n in lengths]
    scores = torch.tensor([1.0, 1.0, 0.0, 0.0]) + 0.5 * torch.tensor(penalties)
    torch.testing.assert_close(batch.scores[8:], scores)
    torch.testing.assert_close(batch.advantages[8:], (scores - scores.mean()) / (scores.std() + 1e-6))


def test_collect_trims_the_last_rounds_extra_groups(model_dir, tmp_path):
    """Filtering on the score without overlong filtering: round 0 keeps groups 0 and 2 (group 2's truncated rows still
    differ in correctness), round 1 keeps group 0 and drops group 2, informative but one group too many."""
    trainer = make_trainer(model_dir, tmp_path, SCENARIOS["dynamic_sampling"])
    batch, stats = trainer.collect(step=1)
    assert (stats["generation_rounds"], stats["kept_groups"]) == (2, 3)
    sampled = [rows_of_round(r) for r in trainer.backend.rounds]
    expected = sampled[0][0:4] + sampled[0][8:12] + sampled[1][0:4]
    assert batch_rows(batch) == [(row.prompt.tolist(), row.response.tolist()) for row in expected]
    s = 0.5 / math.sqrt(1 / 3)  # [1, 0, 1, 0]: mean 0.5, unbiased std sqrt(1/3)
    torch.testing.assert_close(batch.advantages[4:8], torch.tensor([s, -s, s, -s]), atol=1e-5, rtol=1e-5)


def test_a_step_without_signal_or_loss_tokens_skips_the_update_and_still_advances_the_schedule(model_dir, tmp_path):
    """Both ways an update is skipped report skipped_update = 1 and the step's own lr, move no weight, and step the
    schedule: no informative group within the round bound, and a batch whose every row is masked."""
    no_signal = {"script": ([["wrong"] * 4] * 3,), "grpo.dynamic_sampling": "true", "grpo.max_sampling_rounds": "2",
                 "optim.warmup_steps": "2", "run.steps": "3"}
    all_masked = {"script": ([["long"] * 4] * 3,), "grpo.overlong_filter": "true", "optim.warmup_steps": "2",
                  "run.steps": "3"}
    for name, scenario in (("no_signal", no_signal), ("all_masked", all_masked)):
        trainer = make_trainer(model_dir, tmp_path / name, scenario)
        before = copy.deepcopy(trainer.model.state_dict())
        logger = MetricsLogger(tmp_path / name, 3, tensorboard=False, progress=False)
        written = []
        logger.write = written.append
        for step in (1, 2):
            metrics = trainer.train_step(step, logger)
            assert metrics["skipped_update"] == 1.0
            assert metrics["lr"] == pytest.approx(trainer.config.optim.lr * step / 3)  # warm-up: (s + 1) / (2 + 1)
        if name == "no_signal":
            assert (metrics["kept_groups"], metrics["generation_rounds"]) == (0, 2)
            assert written[-1] == "step 2: no group with reward variance after 2 rounds; update skipped"
        else:
            assert metrics["kept_groups"] == 3
            assert written[-1] == "step 2: no loss tokens, or a non-finite loss or gradient; update skipped, weights unchanged"
        assert all(torch.equal(value, trainer.model.state_dict()[key]) for key, value in before.items())


def test_a_non_finite_micro_batch_skips_the_update_but_the_others_are_still_measured(model_dir, tmp_path, monkeypatch):
    import algos.algorithms.grpo

    trainer = make_trainer(model_dir, tmp_path, {"grpo.beta": "0"})
    batch, _ = trainer.collect(step=1)
    aggregate = algos.algorithms.grpo.aggregate_loss
    calls = []

    def first_is_nan(*args, **kwargs):
        calls.append(1)
        loss = aggregate(*args, **kwargs)
        return loss * math.nan if len(calls) == 1 else loss

    monkeypatch.setattr(algos.algorithms.grpo, "aggregate_loss", first_is_nan)
    metrics = trainer.update(batch)
    assert metrics["skipped_update"] == 1.0 and math.isnan(metrics["loss"])
    assert len(calls) == 3  # 12 rows in micro-batches of 5: the two after the non-finite one still ran
    assert metrics["ratio_min"] == pytest.approx(1.0) and metrics["entropy"] > 0
