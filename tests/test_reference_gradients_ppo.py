"""PPO-Clip with GAE and a critic, pinned end to end as tests/test_reference_gradients.py pins GRPO: on scripted
completions (uneven lengths, truncated rows, process rewards), each minibatch's optimizer step must apply the
gradient of the InstructGPT-style objective written here in plain torch: per-token rewards with the KL penalty in
them, GAE over each row, returns before whitening, clipped surrogate + vf_coef x clipped value loss - entropy
bonus, over the rows torch.randperm put in that minibatch; the adaptive KL coefficient follows Ziegler et al.
"""

from __future__ import annotations

import copy

import pytest
import torch
from reference_helpers import (
    OptimizerSpy,
    assert_gradients_equal,
    clip_surrogate,
    clipped_gradients,
    load_weights,
    lr_factor,
    rows_of_round,
    save_tiny_model,
    token_logprobs,
)
from test_reference_gradients import BASE, script

from algos.algorithms.ppo import PRESETS, PPOConfig, PPOTrainer
from algos.config import load_config
from algos.rollout import ScriptedRollout
from algos.run.reporting import MetricsLogger

PPO_BASE = {key: value for key, value in BASE.items() if not key.startswith("grpo.")}
PPO_BASE.update({
    "rollout.prompts_per_step": "3", "rollout.group_size": "2", "loss.micro_batch_size": "2", "ppo.num_minibatches": "2",
    "ppo.ppo_epochs": "2", "ppo.kl_coef": "0.1", "ppo.kl_target": "0.5", "ppo.kl_horizon": "8", "loss.entropy_coef": "0.01",
    "ppo.vf_coef": "0.3", "ppo.value_clip": "0.05", "ppo.lam": "0.9", "ppo.gamma": "0.95", "loss.dual_clip": "1.5",
    "optim.schedule": "linear", "optim.lr": "0.02",
})

SCENARIOS = {
    "head": {"ppo.value_model": "head", "run.steps": "2"},
    # A separate critic; per-sequence policy loss over minibatches of 2, 2, 1 and 1 rows; a KL clamp that binds.
    "separate": {"ppo.value_model": "separate", "ppo.critic_lr": "0.03", "run.steps": "2",
                 "loss.aggregation": "seq-mean-token-mean", "ppo.num_minibatches": "4", "ppo.kl_clamp": "0.02"},
    "critic_warmup": {"ppo.value_model": "head", "ppo.critic_warmup_steps": "1", "run.steps": "3"},
    "no_kl": {"ppo.kl_coef": "0", "ppo.kl_target": "null", "run.steps": "2"},
    # REINFORCE++: no critic (V = 0), so the advantages are the whitened returns; and its group-mean baseline.
    "reinforce_pp": {"preset": "reinforce_pp", "run.steps": "2"},
    "reinforce_pp_baseline": {"preset": "reinforce_pp_baseline", "rollout.group_size": "2", "run.steps": "2"},
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


CLIPS = ("value_clip_frac", "clip_frac_low", "clip_frac_high", "dual_clip_frac")
UPDATE_SUMS = ("value_loss", "value_clip_frac", "policy_loss", "approx_kl_k1", "approx_kl_k3", "entropy", "clip_frac_low",
               "clip_frac_high", "dual_clip_frac", "ratio_mean", "tokens")


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """[T] rewards and values of one row -> ([T] advantages, [T] returns); the value after the last token is 0."""
    advantages, next_value, next_advantage = torch.zeros_like(rewards), 0.0, 0.0
    for t in reversed(range(rewards.numel())):
        delta = rewards[t] + gamma * next_value - values[t]
        next_advantage = advantages[t] = delta + gamma * lam * next_advantage
        next_value = values[t]
    return advantages, advantages + values


class ReferencePPO:
    """The policy, its critic and the reference model at recorded weights, as plain modules."""

    def __init__(self, trainer: PPOTrainer):
        self.trainer = trainer
        self.kind = trainer.config.ppo.value_model
        self.policy_template = copy.deepcopy(trainer.policy)
        self.ref_model = copy.deepcopy(trainer.ref_model)  # None without a KL term

    def at(self, weights: dict[str, torch.Tensor]):
        """(policy, values(row, detach_backbone) -> [T]) at ``weights``; the head's leaves collect its gradient.
        Without a critic (value_model "none") every value is 0."""
        policy = load_weights(self.policy_template, weights, "policy.")
        if self.kind == "none":
            return policy, lambda row, detach_backbone=False: torch.zeros(row.length), {"policy.": policy}
        head_w = weights["critic.head.weight"].clone().requires_grad_(True)
        head_b = weights["critic.head.bias"].clone().requires_grad_(True)
        backbone = policy.model
        if self.kind == "separate":
            backbone = load_weights(self.policy_template.model, weights, "critic.backbone.")

        def values(row, detach_backbone=False):
            ids = torch.cat([row.prompt, row.response])[None]
            hidden = backbone(input_ids=ids).last_hidden_state[0]
            start = row.prompt.numel() - 1  # V of the state before token t, read where token t is predicted
            hidden = hidden[start : start + row.length]
            return (hidden.detach() if detach_backbone else hidden) @ head_w[0] + head_b[0]

        gradients = {"policy.": policy, "critic.head.": {"weight": head_w, "bias": head_b}}
        if self.kind == "separate":
            gradients["critic.backbone."] = backbone
        return policy, values, gradients


def named_gradients(sources: dict) -> dict[str, torch.Tensor]:
    grads = {}
    for prefix, source in sources.items():
        items = source.named_parameters() if isinstance(source, torch.nn.Module) else source.items()
        grads.update({prefix + name: p.grad for name, p in items if p.grad is not None})
    return grads


@pytest.mark.parametrize("name", SCENARIOS)
def test_each_minibatch_step_applies_the_gradient_of_ppo_with_gae(name, model_dir, tmp_path, monkeypatch):
    scenario = dict(SCENARIOS[name])
    preset = PRESETS.get(scenario.pop("preset", None))
    overrides = {**PPO_BASE, "model.path": model_dir, "run.output_dir": str(tmp_path), **scenario}
    trainer = PPOTrainer(load_config(PPOConfig, overrides=overrides, preset=preset), backend=ScriptedRollout(script))
    config, p, lc = trainer.config, trainer.config.ppo, trainer.config.loss
    torch.manual_seed(1)
    assert (trainer.ref_model is None) == (p.kl_coef == 0)  # no KL term, no reference copy
    with torch.no_grad():  # a reference apart from the policy (KL > 0) and a critic that predicts something
        for param in trainer.ref_model.parameters() if trainer.ref_model is not None else ():
            param.add_(0.05 * torch.randn_like(param))
        if trainer.critic is not None:
            trainer.critic.head.weight.normal_(0, 0.3)
            trainer.critic.head.bias.fill_(0.2)
    reference = ReferencePPO(trainer)
    critic = trainer.critic is not None
    spy = OptimizerSpy(trainer.optimizer, {"policy.": trainer.policy, **({"critic.": trainer.critic} if critic else {})})
    permutations = []
    randperm = torch.randperm

    def recorded_randperm(*args, **kwargs):
        permutations.append(randperm(*args, **kwargs))
        return permutations[-1]

    monkeypatch.setattr(torch, "randperm", recorded_randperm)
    logger = MetricsLogger(tmp_path, config.run.steps, tensorboard=False, progress=False)
    coef, exercised = p.kl_coef, set()
    for step in range(1, config.run.steps + 1):
        rounds_before, steps_before, perms_before = len(trainer.backend.rounds), len(spy.steps), len(permutations)
        metrics = trainer.train_step(step, logger)
        (round_,) = trainer.backend.rounds[rounds_before:]
        rows = rows_of_round(round_)
        records = spy.steps[steps_before:]
        train_policy = step > p.critic_warmup_steps
        temperature = config.rollout.temperature

        # Rollout-time quantities, at the weights of the step's first update (nothing moved them since the rollout).
        policy0, values0, _ = reference.at(records[0]["weights"])
        with torch.no_grad():
            old = [token_logprobs(policy0, row, temperature)[0] for row in rows]
            old_values = [values0(row) for row in rows]
            # k1 = log(pi_old / pi_ref), clamped to +-kl_clamp as verl does; no reference, no KL
            kl = [(o - token_logprobs(reference.ref_model, row, temperature)[0]).clamp(-p.kl_clamp, p.kl_clamp)
                  if p.kl_coef else torch.zeros(row.length) for o, row in zip(old, rows)]
        # rollout.group_size rows answer each prompt
        group = config.rollout.group_size
        assert all(torch.equal(rows[i].prompt, rows[i - i % group].prompt) for i in range(len(rows)))
        advantages, returns = [], []
        scores = [row.score for row in rows]
        if p.score_baseline == "group_mean":  # REINFORCE++-baseline: each score minus its prompt's mean score
            scores = [s - sum(scores[i - i % group : i - i % group + group]) / group for i, s in enumerate(scores)]
        for row, row_kl, v, score in zip(rows, kl, old_values, scores):
            rewards = row.step_rewards - coef * row_kl
            rewards[-1] += score
            a, ret = gae(rewards, v, p.gamma, p.lam)
            advantages.append(a)
            returns.append(ret)
        flat_adv, flat_ret, flat_v = torch.cat(advantages), torch.cat(returns), torch.cat(old_values)
        mean, var = flat_adv.mean(), flat_adv.var()
        whitened = [(a - mean) / torch.sqrt(var + 1e-8) for a in advantages]
        sequence_kl = torch.stack([k.sum() for k in kl]).mean().item()
        want = {
            "advantages_mean": mean.item(), "advantages_std": var.sqrt().item(),
            "returns_mean": flat_ret.mean().item(), "returns_std": flat_ret.std().item(),
        }
        if critic:
            want.update({"values_mean": flat_v.mean().item(),
                         "explained_variance": 1 - ((flat_ret - flat_v).var() / flat_ret.var()).item()})
        else:
            assert not {"values_mean", "explained_variance"} & metrics.keys()
        if p.kl_coef:
            want.update({"kl": torch.cat(kl).mean().item(), "kl_sequence": sequence_kl, "kl_coef": coef})
        else:
            assert not {"kl", "kl_sequence", "kl_coef"} & metrics.keys()
        if train_policy and p.kl_coef:  # Ziegler et al.'s controller; it waits out the critic warm-up
            error = min(max(sequence_kl / p.kl_target - 1, -0.2), 0.2)
            coef *= 1 + min(max(error * len(rows) / p.kl_horizon, -0.2), 0.2)

        # The updates: ppo_epochs x num_minibatches optimizer steps over torch.randperm's order.
        minibatches = [mb for order in permutations[perms_before:] for mb in order.tensor_split(p.num_minibatches)]
        assert len(minibatches) == len(records) == p.ppo_epochs * p.num_minibatches
        norms, sums, ratios = [], dict.fromkeys(UPDATE_SUMS, 0.0), []
        for record, minibatch in zip(records, minibatches):
            policy, values, sources = reference.at(record["weights"])
            tokens = sum(rows[i].length for i in minibatch.tolist())
            loss = 0.0
            for i in minibatch.tolist():
                row = rows[i]
                if critic:
                    v = values(row, detach_backbone=not train_policy and reference.kind == "head")
                    clipped_v = old_values[i] + (v - old_values[i]).clamp(-p.value_clip, p.value_clip)
                    unclipped_loss, clipped_loss = (v - returns[i]) ** 2, (clipped_v - returns[i]) ** 2
                    value_loss = 0.5 * torch.maximum(unclipped_loss, clipped_loss)
                    loss = loss + p.vf_coef * value_loss.sum() / tokens
                    sums["value_loss"] += value_loss.sum().item()
                    sums["value_clip_frac"] += (clipped_loss > unclipped_loss).sum().item()
                if train_policy:
                    logp, entropy = token_logprobs(policy, row, temperature)
                    log_ratio = logp - old[i]
                    ratio, advantage = log_ratio.exp(), whitened[i]
                    surrogate = clip_surrogate(ratio, advantage, lc.eps_low, lc.eps_high, lc.dual_clip)
                    policy_loss = surrogate - lc.entropy_coef * entropy
                    if lc.aggregation == "token-mean":
                        aggregated = policy_loss.sum() / tokens
                    else:  # seq-mean-token-mean: each row's token mean, averaged over the minibatch's rows
                        aggregated = policy_loss.mean() / len(minibatch)
                    loss = loss + aggregated
                    unbounded = clip_surrogate(ratio, advantage, lc.eps_low, lc.eps_high)
                    with torch.no_grad():
                        sums["policy_loss"] += aggregated.item() * tokens  # as logged: the loss times the tokens
                        # KL(pi_old || pi), k1 = log(pi_old / pi) and k3, clamped as the reward's KL is
                        sums["approx_kl_k1"] += (-log_ratio).clamp(-p.kl_clamp, p.kl_clamp).sum().item()
                        sums["approx_kl_k3"] += (log_ratio.exp() - log_ratio - 1).clamp(-p.kl_clamp, p.kl_clamp).sum().item()
                        sums["entropy"] += entropy.sum().item()
                        sums["clip_frac_low"] += ((ratio < 1 - lc.eps_low) & (advantage < 0)).sum().item()
                        sums["clip_frac_high"] += ((ratio > 1 + lc.eps_high) & (advantage > 0)).sum().item()
                        sums["dual_clip_frac"] += ((advantage < 0) & (unbounded > -lc.dual_clip * advantage)).sum().item()
                        sums["ratio_mean"] += ratio.sum().item()
                        ratios.append(ratio.detach())
                sums["tokens"] += row.length
            loss.backward()
            grads, norm = clipped_gradients(named_gradients(sources), config.optim.max_grad_norm)
            norms.append(norm)
            assert_gradients_equal(record["grads"], grads)
            delay = p.critic_warmup_steps
            policy_lr = config.optim.lr * lr_factor(max(0, step - 1 - delay), 0, "linear", config.run.steps - delay)
            critic_lr = (p.critic_lr or 10 * config.optim.lr) * lr_factor(step - 1, 0, "linear", config.run.steps)
            assert record["lr"] == [pytest.approx(policy_lr, rel=1e-6), *([pytest.approx(critic_lr, rel=1e-6)] * critic)]
        want["grad_norm"] = sum(norms) / len(norms)
        # The update's statistics: token-weighted over every micro-batch of every epoch.
        seen = sums.pop("tokens")
        want.update({key: value / seen for key, value in sums.items()
                     if (train_policy or key.startswith("value")) and (critic or not key.startswith("value"))})
        if train_policy:
            all_ratios = torch.cat(ratios)
            want.update({"ratio_min": all_ratios.min().item(), "ratio_max": all_ratios.max().item()})
        else:
            assert not (set(UPDATE_SUMS) - {"value_loss", "value_clip_frac", "tokens"}) & metrics.keys()  # no policy step
        want.update({"skipped_updates": 0, "lr": policy_lr, **({"critic_lr": critic_lr} if critic else {})})
        exercised |= {key for key in CLIPS if want.get(key, 0) > 0}
        for key, value in want.items():
            assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
        assert metrics["critic_warmup"] == float(not train_policy)
    assert trainer.kl_controller.coef == pytest.approx(coef, rel=1e-6)
    # each clip was active somewhere: the reference checked it, not a constant 0
    assert exercised == set(CLIPS) - ({"value_clip_frac"} if not critic else set())


def test_a_non_finite_micro_batch_skips_only_its_minibatchs_step(model_dir, tmp_path, monkeypatch):
    """The first micro-batch's loss is NaN: its minibatch's optimizer step is skipped (counted once), the minibatch's
    other micro-batches are still measured, and the next minibatch's step is applied."""
    import algos.algorithms.ppo

    overrides = {**PPO_BASE, "model.path": model_dir, "run.output_dir": str(tmp_path), "ppo.ppo_epochs": "1"}
    trainer = PPOTrainer(load_config(PPOConfig, overrides=overrides), backend=ScriptedRollout(script))
    batch, _ = trainer.collect(step=1)
    aggregate, calls = algos.algorithms.ppo.aggregate_loss, []

    def first_is_nan(*args, **kwargs):
        calls.append(1)
        loss = aggregate(*args, **kwargs)
        return loss * float("nan") if len(calls) == 1 else loss

    monkeypatch.setattr(algos.algorithms.ppo, "aggregate_loss", first_is_nan)
    steps = []
    trainer.optimizer.register_step_pre_hook(lambda *args: steps.append(1))
    metrics = trainer.update(batch, train_policy=True)
    assert metrics["skipped_updates"] == 1 and len(steps) == 1
    assert len(calls) == 2 * 4  # value and policy loss of each micro-batch: 2 minibatches of 3 rows, in 2 + 1
    # a whole step says so on its line
    trainer = PPOTrainer(load_config(PPOConfig, overrides=overrides), backend=ScriptedRollout(script))
    logger = MetricsLogger(tmp_path, 1, tensorboard=False, progress=False)
    written, calls[:] = [], []
    logger.write = written.append
    assert trainer.train_step(1, logger)["skipped_updates"] == 1
    assert written == ["step 1: 1 updates skipped (non-finite loss or gradient)"]
