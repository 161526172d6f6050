"""docs/algorithms.md's TRL mapping, run: TRL 1.16's own GRPOTrainer and DPOTrainer beside ours on the same rows.

Each GRPO case runs our trainer's update on a scripted batch (fixed prompts, completions and rewards: no sampling)
for two iterations, so the second one's ratio has moved off 1 and the clip, the CISPO cap and the KL term all act.
TRL's trainer, built from a GRPOConfig written from the docs' rows, scores the same rows through its real
`_generate_and_score_completions` (the fixed completions handed in by its `rollout_func` hook, the fixed rewards by a
reward function), so its advantages, truncation mask, old and reference log-probs are its own; then its real
`compute_loss` runs at the weights our second iteration started from. Loss, every parameter's gradient and the
metrics both log must agree, or differ by exactly the factor the docs state.

Each DPO case runs our offline trainer two steps (the second with the policy off the reference) and TRL's
DPOTrainer's `compute_loss` on the same pairs, tokenized by TRL from the same dataset rows, at the same weights.
"""

from __future__ import annotations

import json

import pytest
import torch

trl = pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402  (TRL's dependency)
from reference_helpers import OptimizerSpy  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from algos.algorithms.dpo import DPOConfig, DPOTrainer, offline_pair_indices  # noqa: E402
from algos.algorithms.grpo import PRESETS, GRPOConfig, GRPOTrainer  # noqa: E402
from algos.config import load_config  # noqa: E402
from algos.rollout import ScriptedRollout  # noqa: E402
from rlvr_env.testing import build_char_tokenizer, build_tiny_model  # noqa: E402

# fp32 on one thread: our packed, chunked log-probs and TRL's fused LM head agree to float rounding.
RELATIVE_TOLERANCE = 1e-5

MAX_NEW_TOKENS = 12
# Sums of one-digit terms, two or three of them (prompts of uneven length: TRL left-pads them); a right answer in
# \boxed{} scores 1, a bare right one 0.8, a boxed wrong one 0.2: rewards of four levels.
TASK = {"digits": 1, "kinds": [{"terms": 2}, {"terms": 3}], "operators": "+", "prompt_template": "{expression}=",
        "correct_weight": 0.8, "format_weight": 0.2}
# [group][row]: two prompts of four completions; the two "long" rows are cut at the token budget (truncated), the
# "empty" row is the stop token alone.
GROUPS = (("right", "boxed_wrong", "long", "bare"), ("wrong", "right", "long", "empty"))
ROWS, KEPT_ROWS = 8, 6  # rows, and rows that keep loss tokens under overlong filtering: "with 2 of 8 rows masked"


def completion(kind: str, answer) -> str:
    return {"right": f"\\boxed{{{answer}}}", "bare": str(answer), "boxed_wrong": "\\boxed{0}", "wrong": "x",
            "long": "9" * 30, "empty": ""}[kind]


def script(problem, row: int, round_index: int) -> str:
    return completion(GROUPS[row // 4][row % 4], problem.answer)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama and the char tokenizer, saved (TRL loads its reference model from the path); no padded rows in
    the embedding table, so both trainers' softmax runs over the same vocabulary."""
    path = tmp_path_factory.mktemp("trl") / "model"
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def relative_gaps(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], scale: float = 1.0) -> dict[str, float]:
    """|got - scale x want| / |scale x want| for each parameter (the same ones must have a gradient)."""
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    return {name: ((got[name] - scale * want[name]).norm() / (scale * want[name]).norm().clamp(min=1e-30)).item()
            for name in want}


def gradients(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def load_into(model, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(weights[name])


# ---------------------------------------------------------------- GRPO

# Every case: two iterations, no gradient clipping (the spy reads the raw gradient), and our adv_eps at TRL's fixed
# 1e-4 (the docs' `grpo.adv_eps` row).
OUR_GRPO_BASE = {
    "model.autocast": "null", "model.device": "cpu", "env.kwargs": json.dumps(TASK),
    "env.max_new_tokens": str(MAX_NEW_TOKENS), "env.use_chat_template": "false", "env.eval_size": "4",
    "run.progress": "false", "run.tensorboard": "false", "run.plots": "false", "rollout.prompts_per_step": "2",
    "rollout.group_size": "4", "loss.micro_batch_size": "3", "optim.lr": "0.02", "optim.max_grad_norm": "0",
    "grpo.num_iterations": "2", "grpo.adv_eps": "1e-4",
}
TRL_GRPO_BASE = {"num_iterations": 2, "max_completion_length": MAX_NEW_TOKENS, "num_generations": 4,
                 "per_device_train_batch_size": ROWS, "gradient_accumulation_steps": 1}

# case: (our preset, our overrides, TRL GRPOConfig fields from the docs' rows, our loss / TRL's loss)
GRPO_CASES = {
    # The defaults: group-std advantages, per-sequence token means, PPO clip 0.2, k3 KL at beta 0.04 (TRL's KL
    # without its ratio weighting: use_bias_correction_kl = False), each token's KL clamped at 10 (never reached here).
    "grpo": (None, {}, {"loss_type": "grpo", "scale_rewards": "group", "epsilon": 0.2, "epsilon_high": 0.2,
                        "beta": 0.04, "use_bias_correction_kl": False}, 1.0),
    # DAPO: clip-higher, token-mean, overlong filtering (every group keeps its signal, so dynamic sampling keeps
    # both); the soft overlong penalty has no TRL counterpart, so it is off; no KL.
    "dapo": ("dapo", {"grpo.soft_overlong": "false"},
             {"loss_type": "dapo", "scale_rewards": "group", "epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.0,
              "mask_truncated_completions": True}, 1.0),
    # Dr. GRPO: mean-only advantages, token sums over the token budget; with the KL term.
    "dr_grpo": (None, {"grpo.adv_estimator": "dr-grpo", "loss.aggregation": "seq-mean-token-sum-norm"},
                {"loss_type": "dr_grpo", "scale_rewards": "none", "beta": 0.04, "use_bias_correction_kl": False}, 1.0),
    # The batch's std, a tight asymmetric clip, log-probs of the tempered distribution.
    "batch_std": (None, {"grpo.adv_estimator": "batch-std", "loss.eps_low": "0.1", "loss.eps_high": "0.15",
                         "rollout.temperature": "0.7", "grpo.beta": "0"},
                  {"loss_type": "grpo", "scale_rewards": "batch", "epsilon": 0.1, "epsilon_high": 0.15, "temperature": 0.7,
                   "beta": 0.0}, 1.0),
    # GSPO: one ratio per row.
    "gspo": (None, {"loss.surrogate": "gspo", "loss.eps_low": "0.05", "loss.eps_high": "0.05", "grpo.beta": "0"},
             {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 0.05, "epsilon_high": 0.05,
              "beta": 0.0}, 1.0),
    # CISPO: our cap 1 + eps_high is TRL's epsilon_high; a tight cap, so it binds.
    "cispo": ("cispo", {"loss.eps_high": "0.05"}, {"loss_type": "cispo", "epsilon_high": 1.05, "beta": 0.0}, 1.0),
    # Overlong filtering under the per-sequence losses: TRL still divides by all 8 rows, we by the 6 with loss tokens.
    "overlong_filter_grpo": (None, {"grpo.overlong_filter": "true"},
                             {"loss_type": "grpo", "beta": 0.04, "use_bias_correction_kl": False,
                              "mask_truncated_completions": True}, ROWS / KEPT_ROWS),
    "overlong_filter_dr_grpo": (None, {"grpo.overlong_filter": "true", "grpo.adv_estimator": "dr-grpo",
                                       "loss.aggregation": "seq-mean-token-sum-norm", "grpo.beta": "0"},
                                {"loss_type": "dr_grpo", "scale_rewards": "none", "beta": 0.0,
                                 "mask_truncated_completions": True}, ROWS / KEPT_ROWS),
    # The entropy bonus: TRL takes the entropy's token mean whatever loss_type, which our token-mean loss matches.
    "entropy_token_mean": (None, {"loss.aggregation": "token-mean", "loss.entropy_coef": "0.01", "grpo.beta": "0"},
                           {"loss_type": "dapo", "entropy_coef": 0.01, "beta": 0.0}, 1.0),
}


def our_grpo_update(model_dir, output_dir, preset, overrides):
    """Our update's two iterations on the scripted batch -> (the batch, the logged metrics (the second iteration's),
    the second iteration's gradient and the weights it was taken at)."""
    config = load_config(GRPOConfig, preset=PRESETS[preset] if preset else None,
                         overrides={**OUR_GRPO_BASE, "model.path": str(model_dir), "run.output_dir": str(output_dir),
                                    **overrides})
    trainer = GRPOTrainer(config, backend=ScriptedRollout(script))
    spy = OptimizerSpy(trainer.optimizer, {"": trainer.model})
    batch, _ = trainer.collect(step=2)  # step 2's two prompts are of 2 and of 3 terms
    metrics = trainer.update(batch)
    assert len(spy.steps) == 2
    return batch, metrics, spy.steps[1]["grads"], spy.steps[1]["weights"]


def unpadded_rows(batch):
    """Our batch's rows as TRL's rollout_func returns them: [prompt ids], [completion ids] (stop token included)."""
    prompts, completions = [], []
    width = batch.prompt_width
    for ids, mask in zip(batch.input_ids.tolist(), batch.attention_mask.tolist()):
        prompts.append([t for t, m in zip(ids[:width], mask[:width]) if m])
        completions.append([t for t, m in zip(ids[width:], mask[width:]) if m])
    return prompts, completions


def trl_grpo_loss(model_dir, output_dir, trl_fields, batch, weights):
    """TRL's GRPOTrainer on our batch's rows and rewards: scored at the initial weights (old and reference log-probs,
    advantages, masks), its loss taken at ``weights`` -> (loss, gradients, logged metrics, its inputs)."""
    tokenizer = build_char_tokenizer()
    prompt_ids, completion_ids = unpadded_rows(batch)
    texts = [tokenizer.decode(ids) for ids in prompt_ids]
    rewards = batch.scores.tolist()

    def fixed_completions(prompts, trainer):
        assert prompts == texts
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    def fixed_reward(prompts, completions, **kwargs):
        return rewards

    args = trl.GRPOConfig(output_dir=str(output_dir), report_to="none", use_cpu=True, bf16=False, save_strategy="no",
                          **TRL_GRPO_BASE, **trl_fields)
    model = AutoModelForCausalLM.from_pretrained(model_dir)  # its path is where TRL loads the reference from
    trainer = trl.GRPOTrainer(model=model, reward_funcs=fixed_reward, args=args,
                              train_dataset=Dataset.from_dict({"prompt": texts}), processing_class=tokenizer,
                              rollout_func=fixed_completions)
    trainer.model.train()
    inputs = trainer._generate_and_score_completions([{"prompt": text} for text in texts])
    load_into(trainer.model, weights)
    trainer.current_gradient_accumulation_steps = 1  # what the training loop sets with gradient_accumulation_steps 1
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}
    return loss.item(), gradients(trainer.model), metrics, inputs


@pytest.mark.parametrize("case", list(GRPO_CASES))
def test_trl_grpo_trainer_computes_our_loss_and_gradient(model_dir, tmp_path, monkeypatch, case):
    """The docs' GRPOConfig rows: TRL's GRPOTrainer's loss and gradient on our rows equal ours (or differ by the docs'
    factor under overlong filtering), as do the advantages, the KL and the clip fractions both log."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental
    preset, ours, trl_fields, factor = GRPO_CASES[case]
    batch, metrics, our_grads, weights = our_grpo_update(model_dir, tmp_path / "ours", preset, ours)
    assert batch.num_rows == ROWS and int((batch.loss_mask.sum(-1) > 0).sum()) == (
        KEPT_ROWS if trl_fields.get("mask_truncated_completions") else ROWS)
    assert batch.prompt_width > min(batch.attention_mask[:, : batch.prompt_width].sum(-1))  # uneven prompts

    trl_loss, trl_grads, trl_metrics, inputs = trl_grpo_loss(model_dir, tmp_path / "trl", trl_fields, batch, weights)
    torch.testing.assert_close(inputs["advantages"], batch.advantages, rtol=1e-5, atol=1e-6)
    assert metrics["loss"] == pytest.approx(factor * trl_loss, rel=RELATIVE_TOLERANCE, abs=1e-7)
    gaps = relative_gaps(our_grads, trl_grads, factor)
    assert max(gaps.values()) < RELATIVE_TOLERANCE, gaps
    # The second iteration's ratio has moved: the clip (or CISPO's cap) bound somewhere.
    if case == "cispo":
        assert trl_metrics["cispo_clip_ratio"] > 0
        assert metrics["clip_frac_high"] >= trl_metrics["cispo_clip_ratio"]  # ours counts A <= 0 tokens over the cap too
    else:
        assert trl_metrics["clip_ratio/low_mean"] + trl_metrics["clip_ratio/high_mean"] > 0
        if trl_fields.get("importance_sampling_level") != "sequence":  # TRL counts GSPO's per row, we per token
            assert metrics["clip_frac_low"] == pytest.approx(trl_metrics["clip_ratio/low_mean"], abs=1e-6)
            assert metrics["clip_frac_high"] == pytest.approx(trl_metrics["clip_ratio/high_mean"], abs=1e-6)
    if trl_fields.get("beta"):
        assert metrics["kl"] > 0 and metrics["kl"] == pytest.approx(trl_metrics["kl"], rel=1e-5)


# ---------------------------------------------------------------- DPO

# Sums of digits: the right sum chosen; rejected, a run of one to three z's (an odd sum) or the sum plus one (an even
# one), so that after one step the policy prefers some chosen completions and not others; completions of uneven lengths.
PAIRS = [{"prompt": f"{a}+{b}=", "chosen": str(a + b),
          "rejected": "z" * (1 + (a + 2 * b) % 3) if (a + b) % 2 else str(a + b + 1)}
         for a in range(1, 4) for b in range(5, 8)]
PAIRS_PER_STEP = 4


@pytest.fixture(scope="module")
def preferences(tmp_path_factory):
    path = tmp_path_factory.mktemp("prefs") / "prefs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in PAIRS))
    return path


def our_dpo_second_step(model_dir, preferences, output_dir, loss_type: str, beta: float):
    """Our offline DPO's second step (the policy one step off the reference) -> (its pairs' dataset rows, its logged
    metrics, its gradient and the weights it was taken at)."""
    config = load_config(DPOConfig, overrides={
        "model.path": str(model_dir), "model.autocast": "null", "model.device": "cpu", "dpo.dataset": str(preferences),
        "dpo.loss_type": loss_type, "dpo.beta": str(beta), "dpo.pairs_per_step": str(PAIRS_PER_STEP),
        "loss.micro_batch_size": "4", "optim.lr": "1e-2", "optim.max_grad_norm": "0", "run.output_dir": str(output_dir),
        "run.progress": "false", "run.tensorboard": "false", "run.plots": "false", "env.use_chat_template": "false",
        "env.max_new_tokens": "4", "env.eval_size": "4"})
    trainer = DPOTrainer(config)
    spy = OptimizerSpy(trainer.optimizer, {"": trainer.model})
    for step in (1, 2):
        batch, reference, indices = trainer.offline_batch(step)
        metrics = trainer.update(batch, reference)
    assert len(spy.steps) == 2 and indices == offline_pair_indices(config.run.seed, 2, len(PAIRS), PAIRS_PER_STEP)
    ours = [[t for t, m in zip(ids, mask) if m] for ids, mask in zip(batch.input_ids.tolist(), batch.attention_mask.tolist())]
    return indices, ours, metrics, spy.steps[1]["grads"], spy.steps[1]["weights"]


def trl_dpo_loss(model_dir, preferences, output_dir, loss_type: str, beta: float, indices, weights):
    """TRL's DPOTrainer on the same dataset rows, its loss at ``weights`` against the initial model -> (loss, gradients,
    logged metrics, its collated inputs, the trainer)."""
    args = trl.DPOConfig(output_dir=str(output_dir), report_to="none", use_cpu=True, bf16=False, save_strategy="no", beta=beta,
                         loss_type=loss_type, per_device_train_batch_size=PAIRS_PER_STEP)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    trainer = trl.DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(PAIRS),
                             processing_class=build_char_tokenizer())
    inputs = trainer.data_collator([trainer.train_dataset[i] for i in indices])
    load_into(trainer.model, weights)
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}
    return loss.item(), gradients(trainer.model), metrics, inputs, trainer


# Log-probs near -10 agree to ~1e-6 absolute; the rewards (beta x their differences) are often near 0.
METRIC_TOLERANCE = {"rel": 1e-5, "abs": 1e-6}
DPO_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
               "logps/rejected")


@pytest.mark.parametrize("loss_type, beta", [("sigmoid", 0.5), ("ipo", 0.25), ("hinge", 0.5)])
def test_trl_dpo_trainer_computes_our_loss_gradient_and_metrics(model_dir, preferences, tmp_path, loss_type, beta):
    """The docs' DPOConfig rows (beta, loss_type): TRL's DPOTrainer's loss and gradient on the same pairs equal ours,
    and so do its logged rewards/* and logps/*, except IPO's: ours of per-token means where TRL's are of sums."""
    indices, our_rows, metrics, our_grads, weights = our_dpo_second_step(model_dir, preferences, tmp_path / "ours",
                                                                         loss_type, beta)
    trl_loss, trl_grads, trl_metrics, inputs, trainer = trl_dpo_loss(model_dir, preferences, tmp_path / "trl",
                                                                     loss_type, beta, indices, weights)
    # TRL tokenized the rows as we do: ours interleave chosen and rejected, TRL's stack the chosen above the rejected.
    trl_rows = [[t for t, m in zip(ids, mask) if m] for ids, mask in zip(inputs["input_ids"].tolist(),
                                                                          inputs["attention_mask"].tolist())]
    assert our_rows == [row for pair in zip(trl_rows[:PAIRS_PER_STEP], trl_rows[PAIRS_PER_STEP:]) for row in pair]

    assert metrics["loss"] == pytest.approx(trl_loss, rel=RELATIVE_TOLERANCE)
    gaps = relative_gaps(our_grads, trl_grads)
    assert max(gaps.values()) < RELATIVE_TOLERANCE, gaps
    assert 0 < metrics["rewards/accuracies"] < 1  # the policy has left the reference, for some pairs the wrong way
    if loss_type != "ipo":
        for name in DPO_METRICS:
            assert metrics[name] == pytest.approx(trl_metrics[name], **METRIC_TOLERANCE), name
        return
    # IPO: TRL logs means over pairs of sequence sums, we of per-token means: TRL's own sums (its compute_ref_log_probs,
    # on the policy and on the reference) over its completion lengths give ours.
    with torch.no_grad():
        policy_sums = trainer.compute_ref_log_probs(trainer.model, inputs)
        reference_sums = trainer.compute_ref_log_probs(trainer.ref_model, inputs)
    lengths = inputs["completion_mask"].sum(-1).float().chunk(2)
    per_token_rewards = []
    for side, name in enumerate(("chosen", "rejected")):
        rewards_of_sums = beta * (policy_sums[side] - reference_sums[side])
        per_token_rewards.append(rewards_of_sums / lengths[side])
        assert trl_metrics[f"logps/{name}"] == pytest.approx(policy_sums[side].mean().item(), **METRIC_TOLERANCE)
        assert trl_metrics[f"rewards/{name}"] == pytest.approx(rewards_of_sums.mean().item(), **METRIC_TOLERANCE)
        assert metrics[f"logps/{name}"] == pytest.approx((policy_sums[side] / lengths[side]).mean().item(),
                                                          **METRIC_TOLERANCE)
        assert metrics[f"rewards/{name}"] == pytest.approx(per_token_rewards[side].mean().item(), **METRIC_TOLERANCE)
    chosen, rejected = per_token_rewards
    assert metrics["rewards/margins"] == pytest.approx((chosen - rejected).mean().item(), **METRIC_TOLERANCE)
    assert metrics["rewards/accuracies"] == (chosen > rejected).float().mean().item()
