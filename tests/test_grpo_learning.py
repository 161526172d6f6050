"""The agents learn: a tiny character-level model, briefly supervised to a low accuracy on
1-digit addition, is trained with GRPO and with DAPO; each must raise held-out greedy accuracy
by a clear margin within a couple of minutes on CPU."""

import pytest

from algos.algorithms import grpo
from algos.algorithms.grpo import PRESETS, GRPOConfig
from algos.config import load_config
from algos.run.evaluation import evaluate_saved_model
from algos.run.reporting import read_metrics
from algos.system.paths import latest_checkpoint
from rlvr_env.testing import ADDITION_KWARGS, biased_addition_model

TASK_KWARGS = ADDITION_KWARGS
MARGIN = 0.2


def supervised_tiny_model(path, steps: int = 400, seed: int = 0):
    """The tiny model every learning test starts from: ~20% greedy accuracy, right answers still sampled
    (rlvr_env.testing.biased_addition_model)."""
    return biased_addition_model(path, steps=steps, seed=seed)


@pytest.fixture(scope="module")
def sft_model(tmp_path_factory):
    return supervised_tiny_model(tmp_path_factory.mktemp("sft") / "model")


def learning_overrides(model_path, output_dir, **overrides) -> dict[str, str]:
    """The learning runs' settings, as `--key value` overrides take them."""
    base = {
        "model.path": str(model_path),
        "model.autocast": "null",  # the thresholds were measured in fp32; bf16 has its own test
        "env.kwargs": repr(TASK_KWARGS).replace("'", '"'),
        "env.max_new_tokens": "6",
        "env.use_chat_template": "false",
        "env.eval_size": "200",
        "optim.lr": "1e-3",
        "run.steps": "10",
        "run.output_dir": str(output_dir),
        "run.save_every": "0",
        "run.progress": "false",
        "run.tensorboard": "false",
        "rollout.prompts_per_step": "64",
        "rollout.group_size": "8",
        "loss.micro_batch_size": "256",
        "grpo.overlong_cache": "2",
    }
    return {**base, **overrides}


def learning_config(model_path, output_dir, preset=None, **overrides):
    return load_config(GRPOConfig, overrides=learning_overrides(model_path, output_dir, **overrides), preset=preset)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "dapo", "rloo", "cispo", "gmpo"])
def test_agent_raises_held_out_accuracy(algo, sft_model, tmp_path):
    preset = PRESETS.get(algo)
    config = learning_config(sft_model, tmp_path / algo, preset=preset)  # GRPO keeps its KL term (beta 0.04)
    summary = grpo.train(config)
    before, after = summary["eval_accuracy_before"], summary["eval_accuracy_after"]
    print(f"{algo}: held-out accuracy {before:.3f} -> {after:.3f}")
    assert before < 0.5
    assert after >= before + MARGIN
    assert summary["plot"] is not None and summary["plot"].is_file()


@pytest.mark.slow
def test_lora_learns_and_its_saved_adapter_holds_what_was_measured(sft_model, tmp_path):
    """LoRA r 8 (alpha 16) on every linear layer, GRPO with its KL term against the adapter-disabled base: the same
    margin as full fine-tuning, at 10x its learning rate (the usual LoRA ratio; measured: 0.295 -> 0.955)."""
    config = learning_config(sft_model, tmp_path, **{"lora.r": "8", "lora.alpha": "16", "optim.lr": "1e-2"})
    summary = grpo.train(config)
    before, after = summary["eval_accuracy_before"], summary["eval_accuracy_after"]
    print(f"grpo, LoRA r 8: held-out accuracy {before:.3f} -> {after:.3f}")
    assert after >= before + MARGIN
    saved = latest_checkpoint(tmp_path) / "model"
    assert (saved / "adapter_config.json").is_file()  # the adapter alone, loaded merged into its base
    assert evaluate_saved_model(config, saved) == pytest.approx(after)


@pytest.mark.slow
def test_bf16_autocast_learns_and_the_checkpoint_holds_what_was_measured(sft_model, tmp_path):
    config = learning_config(sft_model, tmp_path, **{"model.autocast": "bfloat16"})
    summary = grpo.train(config)
    before, after = summary["eval_accuracy_before"], summary["eval_accuracy_after"]
    print(f"grpo, bf16 autocast: held-out accuracy {before:.3f} -> {after:.3f}")
    assert after >= before + MARGIN
    # The saved model, loaded afresh, scores what the loop measured (a stale autocast cast would not).
    assert evaluate_saved_model(config, latest_checkpoint(tmp_path) / "model") == pytest.approx(after)


@pytest.mark.slow
@pytest.mark.parametrize("staleness", [1, 2])
def test_rollouts_that_overlap_training_learn_with_the_correction_on(staleness, sft_model, tmp_path):
    """rollout.max_staleness k: each step trains on a batch drawn by the weights of k steps before, weighed by the
    truncated importance weight pi_old / pi_behaviour (loss.rollout_correction "auto" -> "tis"); the same margin."""
    config = learning_config(sft_model, tmp_path, **{"rollout.max_staleness": str(staleness)})
    summary = grpo.train(config)
    before, after = summary["eval_accuracy_before"], summary["eval_accuracy_after"]
    print(f"grpo, rollout.max_staleness {staleness}: held-out accuracy {before:.3f} -> {after:.3f}")
    assert after >= before + MARGIN
    records = [r for r in read_metrics(tmp_path) if "async/staleness" in r]
    assert [r["async/staleness"] for r in records][staleness:] == [staleness] * (10 - staleness)
    # the stale batches' recorded log-probs are off the learner's, and the correction weighs them
    assert all(r["rollout_logp_abs_diff"] > 0 and "rollout_is_weight_mean" in r for r in records[staleness:])
