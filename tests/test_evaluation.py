"""algos/run/evaluation.py: held-out accuracy is the share of problems solved, over the problems asked, of the model
directory it is given."""

from types import SimpleNamespace

import pytest
import torch

from algos.algorithms.grpo import GRPOConfig
from algos.config import load_config
from algos.run import evaluation
from algos.run.evaluation import eval_task, evaluate, evaluate_saved_model, zero_shot
from rlvr_env.testing import build_char_tokenizer, build_tiny_model


class EveryThirdSolved:
    """A rollout backend whose greedy batch solves the rows 0, 3, 6, ... of each batch it is asked for."""

    def __init__(self):
        self.rows = []

    def generate(self, model, env, greedy):
        assert greedy
        self.rows.append(env.num_envs)
        return SimpleNamespace(solved=torch.arange(env.num_envs) % 3 == 0)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny")
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def config_for(path, **env):
    overrides = {"model.path": str(path), "env.kwargs": "{digits: 1}", "env.max_new_tokens": "2",
                 "env.use_chat_template": "false", **{f"env.{key}": str(value) for key, value in env.items()}}
    return load_config(GRPOConfig, overrides=overrides)


def test_accuracy_is_the_problems_solved_over_the_problems_asked_batch_by_batch(tiny_dir):
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2)
    backend = EveryThirdSolved()
    # 7 problems in batches of 3, 3, 1: rows 0 of each batch solved -> 3 of 7
    accuracy = evaluate(model, tokenizer, config_for(tiny_dir, eval_size=7, eval_batch_size=3), backend,
                        torch.device("cpu"))
    assert backend.rows == [3, 3, 1]
    assert accuracy == pytest.approx(3 / 7)
    assert model.training  # the mode it came in with is restored


def test_a_saved_model_is_scored_from_the_directory_given_not_the_configs(tiny_dir, tmp_path):
    # the config names a directory that does not exist: only the path passed may be read
    config = config_for(tmp_path / "no-such-model", eval_size=3)
    accuracy = evaluate_saved_model(config, tiny_dir)
    assert 0.0 <= accuracy <= 1.0
    assert config.model.path == str(tmp_path / "no-such-model")  # the caller's config is left as it is


def test_a_saved_model_is_scored_on_the_problems_given(tiny_dir, monkeypatch):
    backend = EveryThirdSolved()
    monkeypatch.setattr(evaluation, "make_rollout_backend", lambda config: backend)
    config = config_for(tiny_dir, eval_size=3)
    task, _ = eval_task(config)
    # five problems given, against the config's three: rows 0 and 3 of the one batch solved -> 2 of 5
    assert evaluate_saved_model(config, tiny_dir, eval_set=(task, [0, 1, 2, 3, 4])) == pytest.approx(2 / 5)
    assert backend.rows == [5]


def test_zero_shot_asks_the_bare_question_in_the_chat_template(tiny_dir):
    config = config_for(tiny_dir)  # plain-text prompts
    asked = zero_shot(config)
    assert asked.env.use_chat_template is True and asked.env.eval_kwargs["few_shot"] == []
    assert config.env.use_chat_template is False and "few_shot" not in config.env.eval_kwargs  # the caller's is kept
