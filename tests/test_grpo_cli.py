"""`rlvr train` / `rlvr eval` argument handling (the runs themselves are covered by test_grpo_loop/learning)."""

import argparse
import json
import warnings
from types import SimpleNamespace

import pytest

from algos import cli
from rlvr_env.cli import main
from rlvr_env.testing import build_char_tokenizer, build_tiny_model


def test_unknown_override_is_rejected_by_name(capsys):
    assert main(["train", "--algo", "grpo", "--model", "x", "--grpo.gruop_size", "4"]) == 2
    assert "unknown config key 'grpo.gruop_size'" in capsys.readouterr().err


def test_bad_value_names_the_field(capsys):
    assert main(["train", "--algo", "dapo", "--grpo.eps_low", "1.5"]) == 2
    assert "grpo.eps_low" in capsys.readouterr().err


def test_missing_algorithm_module_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(cli.ALGORITHMS, "nope", ("algos.no_such_algorithm", None))
    args = argparse.Namespace(algo="nope", config=None, env=None, model=None, resume=False, overrides=[])
    assert cli._train(args) == 2
    assert "algorithm 'nope' is not available" in capsys.readouterr().err


def test_eval_prints_held_out_accuracy(tmp_path, capsys):
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    code = main([
        "eval", "--env", "rlvr/Arithmetic-v0", "--model", str(tmp_path), "--num-problems", "4",
        "--env.max_new_tokens", "3", "--env.kwargs", "{digits: 1}",
    ])
    assert code == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["problems"] == 4 and 0.0 <= report["accuracy"] <= 1.0


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_eval_reads_a_training_runs_saved_config(algo, tmp_path, capsys):
    import importlib

    from algos.config import save_config

    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    config = importlib.import_module(cli.ALGORITHMS[algo][0]).Config()
    config.model.path, config.env.eval_size, config.env.max_new_tokens = str(tmp_path), 3, 2
    config.env.kwargs = {"digits": 1}
    save_config(config, tmp_path / "config.yaml")  # as a run saves it: optim, run and grpo/ppo sections included
    assert main(["eval", "--config", str(tmp_path / "config.yaml")]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["problems"] == 3


def test_eval_still_rejects_an_unknown_section(tmp_path, capsys):
    (tmp_path / "run.yaml").write_text("envv: {id: rlvr/Arithmetic-v0}\n")
    assert main(["eval", "--config", str(tmp_path / "run.yaml")]) == 2
    assert "unknown config key 'envv'" in capsys.readouterr().err


@pytest.mark.parametrize("algo", ["grpo", "dapo"])
def test_algorithm_table_resolves_presets(algo):
    import importlib

    module_name, preset = cli.ALGORITHMS[algo]
    module = importlib.import_module(module_name)
    assert hasattr(module, "Config") and callable(module.train)
    assert preset is None or preset in module.PRESETS


def test_eval_of_a_dataset_scores_each_problem_of_the_eval_file_once(tmp_path, capsys):
    """A dataset task's eval used to draw eval_size indices with replacement from the training file;
    now it reads env.eval_kwargs' file, each of its first eval_size problems once."""
    from pathlib import Path

    from algos.config import EvalConfig
    from algos.trainer import eval_task, warn_if_eval_reads_training_data

    test_file = Path(__file__).parent / "data" / "gsm8k_tiny.jsonl"  # 3 problems
    config = EvalConfig()
    config.env.id, config.env.kwargs = "rlvr/GSM8K-v0", {"data_path": str(tmp_path / "train_file_never_read.jsonl")}
    config.env.eval_kwargs, config.env.eval_size = {"data_path": str(test_file)}, 10
    task, indices = eval_task(config)
    assert indices == [0, 1, 2] and task.problem(2, 0).answer == "5000"
    config.env.eval_size = 2
    assert eval_task(config)[1] == [0, 1]

    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    code = main([
        "eval", "--env", "rlvr/GSM8K-v0", "--model", str(tmp_path / "model"), "--num-problems", "10",
        "--env.max_new_tokens", "2", "--env.use_chat_template", "false",
        "--env.kwargs", f"{{data_path: {tmp_path / 'train_file_never_read.jsonl'}}}",
        "--env.eval_kwargs", f"{{data_path: {test_file}}}",
    ])
    assert code == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["problems"] == 3

    config.env.kwargs, config.env.eval_kwargs = {"data_path": str(test_file)}, {}
    with pytest.warns(UserWarning, match="scores problems of the training data"):
        warn_if_eval_reads_training_data(config, eval_task(config)[0])
    with warnings.catch_warnings():  # a sized generator (reasoning-gym) draws its eval problems from eval_seed
        warnings.simplefilter("error")
        warn_if_eval_reads_training_data(config, SimpleNamespace(size=500))
