"""run.metric_for_best_model: the policy at the best held-out evaluation is kept in output_dir/best_model, beside the
last one, across a resume; an unknown or unscored metric is refused by name."""

import json

import pytest
import torch
from safetensors.torch import load_file

from algos.algorithms.grpo import GRPOConfig, train
from algos.config import load_config
from algos.run import loop
from algos.run.reporting import read_metrics
from rlvr_env.testing import ADDITION_KWARGS, saved_tiny_model

TASK = json.dumps(ADDITION_KWARGS)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return saved_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden_size=32, num_layers=1, num_heads=2)


def best_model_config(model_dir, output_dir, steps, **extra):
    return load_config(GRPOConfig, overrides={
        "model.path": str(model_dir), "model.autocast": "null", "env.kwargs": TASK, "env.max_new_tokens": "4",
        # all rewards are 0 for this untrained model: the entropy bonus is what moves the weights each step
        "env.use_chat_template": "false", "env.eval_size": "4", "optim.lr": "1e-2", "run.output_dir": str(output_dir),
        "run.progress": "false", "run.tensorboard": "false", "run.plots": "false", "rollout.prompts_per_step": "4",
        "rollout.group_size": "4", "loss.entropy_coef": "0.1", "run.steps": str(steps), "run.save_every": "1",
        "run.keep_last": "10", "run.eval_every": "1", "run.metric_for_best_model": "eval_accuracy", **extra})


@pytest.fixture
def scripted_scores(monkeypatch):
    """Each held-out evaluation of the loop returns the next of the scores given, in order."""
    scores: list[float] = []
    monkeypatch.setattr(loop, "evaluate", lambda *args, **kwargs: scores.pop(0))
    return scores


def weights(directory):
    return load_file(directory / "model.safetensors")


def same_weights(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_best_evaluations_policy_is_kept_and_a_tie_keeps_the_earlier_one(tiny_model_dir, tmp_path, scripted_scores):
    scripted_scores += [0.25, 0.5, 0.25, 0.5, 0.25]  # before, steps 1-4
    summary = train(best_model_config(tiny_model_dir, tmp_path, steps=4))

    best_dir = tmp_path / "best_model"
    assert json.loads((best_dir / "best.json").read_text()) == {"metric": "eval_accuracy", "value": 0.5, "step": 1}
    assert summary["best_model"] == {"path": str(best_dir), "metric": "eval_accuracy", "value": 0.5, "step": 1}
    assert same_weights(weights(best_dir), weights(tmp_path / "checkpoint-1" / "model"))
    assert not same_weights(weights(best_dir), weights(tmp_path / "checkpoint-2" / "model"))  # the steps moved it
    assert (best_dir / "tokenizer_config.json").is_file()  # a model directory `rlvr eval --model` loads
    assert not list(tmp_path.glob(".best_model*"))  # no temporary or stale copy left


def test_a_resumed_run_competes_with_the_best_model_it_left(tiny_model_dir, tmp_path, scripted_scores):
    scripted_scores += [0.25, 0.5, 0.25]  # before, steps 1-2
    train(best_model_config(tiny_model_dir, tmp_path, steps=2))
    scripted_scores += [0.375, 0.45]  # steps 3-4: below step 1's 0.5, so neither replaces it
    config = best_model_config(tiny_model_dir, tmp_path, steps=4)
    config.run.overwrite_output_dir = False
    summary = train(config, resume=True)

    assert summary["best_model"]["step"] == 1 and summary["best_model"]["value"] == 0.5
    assert same_weights(weights(tmp_path / "best_model"), weights(tmp_path / "checkpoint-1" / "model"))


def test_a_run_resumed_from_its_first_checkpoint_keeps_the_best_model_it_left(tiny_model_dir, tmp_path, scripted_scores):
    scripted_scores += [0.5, 0.25]  # before, step 1: the initial policy is the best
    train(best_model_config(tiny_model_dir, tmp_path, steps=1))
    scripted_scores += [0.375]  # step 2: the best of the resumed process's evaluations, below the one before
    config = best_model_config(tiny_model_dir, tmp_path, steps=2)
    config.run.overwrite_output_dir = False
    summary = train(config, resume=True)

    assert summary["best_model"]["step"] == 0 and summary["best_model"]["value"] == 0.5
    assert same_weights(weights(tmp_path / "best_model"), weights(tiny_model_dir))


def test_a_fresh_run_without_the_metric_keeps_no_earlier_runs_best_model(tiny_model_dir, tmp_path, scripted_scores):
    scripted_scores += [0.25, 0.5]
    train(best_model_config(tiny_model_dir, tmp_path, steps=1))
    assert (tmp_path / "best_model").is_dir()
    scripted_scores += [0.25, 0.5]
    summary = train(best_model_config(tiny_model_dir, tmp_path, steps=1, **{
        "run.metric_for_best_model": "null", "run.overwrite_output_dir": "true"}))

    assert "best_model" not in summary and not (tmp_path / "best_model").exists()


def test_a_fresh_run_starts_over_from_what_a_killed_run_left(tiny_model_dir, tmp_path, scripted_scores):
    """No checkpoint, so nothing to resume: an earlier best_model (however good) and half-written copies give way."""
    (tmp_path / "best_model").mkdir(parents=True)
    (tmp_path / "best_model" / "best.json").write_text('{"metric": "eval_accuracy", "value": 0.9, "step": 3}')
    for leftover in (".best_model.tmp", ".best_model.stale"):
        (tmp_path / leftover).mkdir()
        (tmp_path / leftover / "junk.txt").write_text("half written")
    scripted_scores += [0.25, 0.125]
    train(best_model_config(tiny_model_dir, tmp_path, steps=1))

    # the evaluation before training was the best: step 0, the initial weights
    assert json.loads((tmp_path / "best_model" / "best.json").read_text()) == {"metric": "eval_accuracy", "value": 0.25,
                                                                                "step": 0}
    assert same_weights(weights(tmp_path / "best_model"), weights(tiny_model_dir))
    assert not (tmp_path / "best_model" / "junk.txt").exists() and not list(tmp_path.glob(".best_model*"))


def test_a_warm_start_that_scores_best_is_kept_as_step_0(tiny_model_dir, tmp_path, scripted_scores):
    scripted_scores += [0.25, 0.75, 0.5]  # before, after the warm start, step 1
    train(best_model_config(tiny_model_dir, tmp_path, steps=1, **{"warm_start.steps": "2", "warm_start.batch_size": "4"}))

    assert json.loads((tmp_path / "best_model" / "best.json").read_text()) == {"metric": "eval_accuracy", "value": 0.75,
                                                                                "step": 0}
    assert same_weights(weights(tmp_path / "best_model"), weights(tmp_path / "warm_start"))
    assert [r["step"] for r in read_metrics(tmp_path) if "eval_accuracy_warm_start" in r] == [0]  # logged before RL's step 1


def test_a_resume_that_changes_the_metric_starts_its_best_model_over(tiny_model_dir, tmp_path, scripted_scores):
    other_wording = {"env.transfer_eval_kwargs": '{"prompt_template": "{expression} ="}'}
    scripted_scores += [0.5, 0.125, 0.25, 0.25]  # (own, other wording) before and at step 1
    train(best_model_config(tiny_model_dir, tmp_path, steps=1, **other_wording))
    scripted_scores += [0.25, 0.1875]  # step 2: below the own wording's best, the best yet on the other
    train(best_model_config(tiny_model_dir, tmp_path, steps=2, **other_wording, **{
        "run.metric_for_best_model": "eval_accuracy_transfer", "run.overwrite_output_dir": "false"}), resume=True)

    best = json.loads((tmp_path / "best_model" / "best.json").read_text())
    assert best == {"metric": "eval_accuracy_transfer", "value": 0.1875, "step": 2}


@pytest.mark.parametrize(("metric", "error"), [
    ("eval_loss", "run.metric_for_best_model: must be one of ('eval_accuracy', 'eval_accuracy_transfer')"),
    ("eval_accuracy_transfer", "run.metric_for_best_model: eval_accuracy_transfer is scored only when "
                               "env.transfer_eval_kwargs"),
])
def test_a_metric_no_evaluation_scores_is_refused_by_name(tiny_model_dir, tmp_path, metric, error):
    with pytest.raises(ValueError, match=error.replace("(", r"\(").replace(")", r"\)")):
        best_model_config(tiny_model_dir, tmp_path, steps=1, **{"run.metric_for_best_model": metric}).validate()
