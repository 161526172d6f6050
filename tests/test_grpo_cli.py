"""`rlvr train` / `rlvr eval` argument handling (the runs themselves are covered by test_grpo_loop/learning)."""

import argparse
import dataclasses
import json
import re
import shlex
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from algos import cli
from rlvr_cli import main
from rlvr_env.testing import build_char_tokenizer, build_tiny_model


def test_unknown_override_is_rejected_by_name(capsys):
    assert main(["train", "--algo", "grpo", "--model", "x", "--grpo.gruop_size", "4"]) == 2
    assert "unknown config key 'grpo.gruop_size'" in capsys.readouterr().err


@pytest.mark.parametrize("key, hint", [
    ("lrr", "(did you mean optim.lr or warm_start.lr?"),
    ("seeed", "(did you mean run.seed?"),
    ("nonsense", "(a key is section.field; sections: model, env, rollout, static, vllm, run, distributed, optim, "
                 "loss, alarms, warm_start, lora, grpo)"),
    ("decode_graph", "(did you mean static.decode_graph?"),  # an engine's keys are always named with their section
])
def test_unknown_bare_key_names_the_keys_it_may_mean(key, hint, capsys):
    """`--grpo.gruop_size` listed the known keys; `--lrr` listed nothing."""
    assert main(["train", "--algo", "grpo", "--model", "x", f"--{key}", "1"]) == 2
    assert f"unknown config key {key!r} {hint}" in capsys.readouterr().err


def test_train_help_lists_every_config_key_with_its_default(capsys):
    from algos.algorithms.grpo import GRPOConfig
    from algos.algorithms.ppo import PPOConfig
    from algos.config import sections

    with pytest.raises(SystemExit) as exited:
        main(["train", "--algo", "dapo", "--help"])
    assert exited.value.code == 0
    listing = capsys.readouterr().out
    config = GRPOConfig()
    for name, section in sections(config):  # the engines' own sections ([static], [vllm]) too
        keys = re.search(rf"^{name}:\n((?:  .*\n?)*)", listing, re.M).group(1).splitlines()
        assert [line.split()[0] for line in keys] == [f.name for f in dataclasses.fields(section)]
    assert re.search(r"^  eps_high +float +0\.28$", listing, re.M)  # the dapo preset's value (GRPO's is 0.2)
    assert re.search(r"^  dual_clip +float \| None +null$", listing, re.M)
    assert "\nppo:" not in listing

    with pytest.raises(SystemExit):
        main(["train", "--help"])  # no --algo: the shared sections and every algorithm's own
    listing = capsys.readouterr().out
    assert all(f"\n{name}:\n" in listing for config in (GRPOConfig(), PPOConfig()) for name, _ in sections(config))


def test_eval_help_lists_the_sections_it_reads(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    listing = capsys.readouterr().out
    assert re.search(r"^  eval_size +int +100$", listing, re.M) and "\noptim:" not in listing
    # greedy decoding: the sampling keys are said not to apply, and are not listed as if they did
    assert "decoding is greedy" in listing and not re.search(r"^  (temperature|top_p|top_k) ", listing, re.M)


def test_a_bad_problem_count_names_the_flag_typed(capsys):
    """`--num-problems 0` was refused as env.eval_size, a key the command line never named."""
    with pytest.raises(SystemExit) as exited:
        main(["eval", "--num-problems", "0"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --num-problems: must be >= 1, got 0" in err and "eval_size" not in err


def test_bad_value_names_the_field(capsys):
    assert main(["train", "--algo", "dapo", "--loss.eps_low", "1.5"]) == 2
    assert "loss.eps_low" in capsys.readouterr().err


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
    from algos.run.evaluation import eval_task, warn_if_eval_reads_training_data

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


@pytest.fixture
def tiny_dir(tmp_path):
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    return tmp_path


TINY_RUN = ["--env.kwargs", "{digits: 1}", "--env.max_new_tokens", "2", "--env.eval_size", "2", "--env.use_chat_template",
            "false", "--run.progress", "false", "--run.tensorboard", "false", "--run.plots", "false",
            "--rollout.prompts_per_step", "2", "--rollout.group_size", "2", "--run.steps", "1"]


def _train(tiny_dir, *extra):
    return main(["train", "--algo", "grpo", "--model", str(tiny_dir / "model"), *TINY_RUN,
                 "--run.output_dir", str(tiny_dir / "run"), *extra])


def test_ordinary_mistakes_are_one_line_errors_not_tracebacks(tiny_dir, capsys):
    """Each of these was a traceback from inside the trainer (the message at its bottom, rc 1)."""
    assert _train(tiny_dir) == 0
    capsys.readouterr()
    mistakes = [
        ([], "holds checkpoint-1 of an earlier run: resume it"),  # the same command again
        (["--model", str(tiny_dir / "nowhere"), "--run.output_dir", str(tiny_dir / "other")], "does not exist"),
        (["--env.kwargs", "{digits: 1, bogus: 2}", "--run.output_dir", str(tiny_dir / "other")], "with env.kwargs"),
        (["--env", "rlvr/Arithmetc-v0", "--run.output_dir", str(tiny_dir / "other")], "no task registered as"),
    ]
    for extra, message in mistakes:
        assert _train(tiny_dir, *extra) == 2, extra
        err = capsys.readouterr().err  # transformers' "Loading weights" bar may come first
        assert err.splitlines()[-1].startswith("rlvr: ") and message in err and "Traceback" not in err, (extra, err)
    assert not (tiny_dir / "other").exists()  # refused before a config.yaml was written
    (tiny_dir / "broken.yaml").write_text("run: {steps: 2\n")
    assert _train(tiny_dir, "--config", str(tiny_dir / "broken.yaml")) == 2
    assert f"config file {tiny_dir / 'broken.yaml'}: not valid YAML" in capsys.readouterr().err


def test_resume_checks_what_the_checkpoint_trained_with_not_the_editable_config_yaml(tiny_dir, capsys):
    """A hand-edited lr in the run's config.yaml was accepted on resume while the checkpoint's optimizer kept the
    old one (metrics logged the old lr)."""
    assert _train(tiny_dir) == 0
    saved = tiny_dir / "run" / "config.yaml"
    saved.write_text(saved.read_text().replace("lr: 1.0e-06", "lr: 0.001"))
    capsys.readouterr()
    assert main(["train", "--algo", "grpo", "--config", str(saved), "--resume", "--run.steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "optim.lr: 1e-06 -> 0.001" in err and "checkpoint-1/config.yaml" in err
    with pytest.warns(UserWarning, match="nothing to train"):
        assert _train(tiny_dir, "--resume") == 0  # a finished run: a job script may pass --resume again
    assert _train(tiny_dir, "--resume", "--run.steps", "2") == 0
    capsys.readouterr()
    assert _train(tiny_dir, "--resume", "--run.steps", "1") == 2  # below the checkpoint's step
    assert "checkpoint-2 with run.steps = 1: it has trained 2 steps" in capsys.readouterr().err


def test_ctrl_c_says_where_the_run_stands(tiny_dir, monkeypatch, capsys):
    from algos.algorithms.grpo import GRPOTrainer

    def interrupted(self, step, logger):
        raise KeyboardInterrupt

    monkeypatch.setattr(GRPOTrainer, "train_step", interrupted)
    assert _train(tiny_dir, "--run.output_dir", str(tiny_dir / "fresh")) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "rlvr: interrupted during step 1; no checkpoint was saved yet"
    monkeypatch.undo()
    assert _train(tiny_dir, "--run.save_every", "1") == 0
    monkeypatch.setattr(GRPOTrainer, "train_step", interrupted)
    capsys.readouterr()
    assert _train(tiny_dir, "--resume", "--run.steps", "3", "--run.plots", "true") == 130
    last_line = capsys.readouterr().err.splitlines()[-1]
    assert last_line == "rlvr: interrupted during step 2; checkpoint-1 is the last checkpoint; --resume continues from it"
    assert (tiny_dir / "run" / "curves.png").is_file()  # an interrupted run still draws the steps it did


def test_evaluation_in_batches_scores_the_same_problems_as_one_batch(tiny_dir):
    """eval_size rows were generated at once: a full GSM8K test set (1,319 rows) in one KV cache."""
    from algos.config import EvalConfig, load_config
    from algos.model.loading import load_policy
    from algos.rollout import HFRollout, make_env
    from algos.run.evaluation import evaluate, procedural_eval_indices

    config = load_config(EvalConfig, overrides=["--model.path", str(tiny_dir / "model"), "--env.kwargs", "{digits: 1}",
                                                "--env.max_new_tokens", "3", "--env.eval_size", "7"])
    model, tokenizer = load_policy(config.model.path, device="cpu")
    env = make_env(config, tokenizer, num_envs=7, device=torch.device("cpu"), problem_seed=config.env.eval_seed)
    _, info = env.reset(seed=config.env.eval_seed)
    assert procedural_eval_indices(config) == info["problem_indices"]  # the problems one reset would draw

    class Recording(HFRollout):
        def generate(self, model, env, **sampling):
            batches.append([problem.prompt for problem in env.problems])
            return super().generate(model, env, **sampling)

    seen = {}
    for size in (0, 3):
        batches = []
        config.env.eval_batch_size = size
        accuracy = evaluate(model, tokenizer, config, Recording(), device=torch.device("cpu"))
        seen[size] = (batches, accuracy)
    assert [len(b) for b in seen[3][0]] == [3, 3, 1]
    assert sum(seen[3][0], []) == seen[0][0][0] == [p.prompt for p in env.problems]
    assert seen[3][1] == pytest.approx(seen[0][1])


def test_eval_of_a_run_directory_scores_its_latest_checkpoint_and_says_so(tiny_dir, capsys):
    assert _train(tiny_dir) == 0
    capsys.readouterr()
    assert main(["eval", "--model", str(tiny_dir / "run"), "--env.kwargs", "{digits: 1}", "--num-problems", "2",
                 "--env.max_new_tokens", "2"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["model"] == str(tiny_dir / "run") and report["model_dir"] == str(tiny_dir / "run" / "checkpoint-1" / "model")


def test_a_run_or_checkpoint_directory_as_the_model_is_recorded_as_the_model_it_names(tiny_dir, capsys):
    """model.path runs/a followed runs/a's latest checkpoint: a resume rebuilt the KL reference from newer weights."""
    assert _train(tiny_dir) == 0
    with pytest.warns(UserWarning, match="resolves to .*checkpoint-1/model; the run records that"):
        assert main(["train", "--algo", "grpo", "--model", str(tiny_dir / "run"), *TINY_RUN,
                     "--run.output_dir", str(tiny_dir / "b")]) == 0
    from algos.algorithms.grpo import GRPOConfig
    from algos.config import load_config

    assert load_config(GRPOConfig, tiny_dir / "b" / "config.yaml").model.path == str(tiny_dir / "run" / "checkpoint-1" / "model")
    capsys.readouterr()  # overwriting a run whose checkpoint is the model would delete the model first
    with pytest.warns(UserWarning, match="resolves to"):
        assert main(["train", "--algo", "grpo", "--model", str(tiny_dir / "run"), *TINY_RUN, "--run.output_dir",
                     str(tiny_dir / "run"), "--run.overwrite_output_dir", "true"]) == 2
    assert "is inside run.output_dir" in capsys.readouterr().err
    assert (tiny_dir / "run" / "checkpoint-1" / "model" / "config.json").is_file()


def test_a_run_resumes_under_another_spelling_of_its_env_id(tiny_dir):
    assert _train(tiny_dir, "--env", "arithmetic", "--run.save_every", "1") == 0
    assert _train(tiny_dir, "--env", "rlvr/Arithmetic-v0", "--resume", "--run.steps", "2") == 0


def test_rlvr_traceback_shows_the_traceback_instead_of_one_line(tiny_dir, monkeypatch, capsys):
    monkeypatch.setenv("RLVR_TRACEBACK", "1")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        _train(tiny_dir, "--model", str(tiny_dir / "nowhere"))
    monkeypatch.delenv("RLVR_TRACEBACK")
    monkeypatch.setattr(cli, "_load", lambda *args, **kwargs: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(["eval", "--model", "x"]) == 130  # Ctrl-C outside the training loop
    assert capsys.readouterr().err.strip() == "rlvr: interrupted"


def test_a_model_refused_on_loading_leaves_no_run_behind(tiny_dir, capsys):
    """load_policy's checks ran after config.yaml was written (and after overwrite_output_dir deleted checkpoints)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_char_tokenizer()
    small = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2))  # 50 embedding rows for a larger tokenizer
    small.save_pretrained(tiny_dir / "small")
    tokenizer.save_pretrained(tiny_dir / "small")
    assert main(["train", "--algo", "grpo", "--model", str(tiny_dir / "small"), *TINY_RUN,
                 "--run.output_dir", str(tiny_dir / "refused")]) == 2
    assert "but the model's input embeddings have only 50 rows" in capsys.readouterr().err
    assert not (tiny_dir / "refused").exists()


def test_the_vllm_backend_without_vllm_is_a_config_error_before_the_run_starts(tiny_dir, capsys, monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(name, *a))
    assert _train(tiny_dir, "--rollout.backend", "vllm") == 2
    assert "rollout.backend = 'vllm' needs vllm" in capsys.readouterr().err
    assert not (tiny_dir / "run").exists()


def test_one_config_file_serves_every_algorithm(tiny_dir, capsys):
    """Each algorithm sets the other algorithms' sections aside, and its --help says which they are."""
    (tiny_dir / "both.yaml").write_text(
        "env: {kwargs: {digits: 1}, max_new_tokens: 2, eval_size: 2, use_chat_template: false}\n"
        "run: {steps: 1, progress: false, tensorboard: false, plots: false}\n"
        "rollout: {prompts_per_step: 2, group_size: 2}\n"
        "grpo: {beta: 0.0}\n"
        "ppo: {kl_coef: 0.0}\n")
    for algo in ("grpo", "ppo"):
        assert main(["train", "--algo", algo, "--config", str(tiny_dir / "both.yaml"), "--model", str(tiny_dir / "model"),
                     "--run.output_dir", str(tiny_dir / algo)]) == 0, capsys.readouterr().err
        assert (tiny_dir / algo / "metrics.jsonl").exists()
    assert main(["train", "--algo", "ppo", "--grpo.beta", "0.1", "--model", str(tiny_dir / "model")]) == 2
    assert "unknown config key 'grpo'" in capsys.readouterr().err  # a flag is for the algorithm it runs
    with pytest.raises(SystemExit):
        main(["train", "--algo", "ppo", "--help"])
    assert "sections of other algorithms, dpo, grpo, are set aside" in capsys.readouterr().out


def _readme_block(after: str, language: str) -> str:
    """The first ```language block of README.md after the line containing ``after``."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    start = text.index(f"```{language}\n", text.index(after)) + len(language) + 4
    return text[start : text.index("```", start)]


def test_the_readme_s_own_task_trains_from_the_cli_by_its_module(tiny_dir, capsys, monkeypatch):
    """README's "register your own task" section: its code saved as my_tasks.py, then its training command."""
    (tiny_dir / "my_tasks.py").write_text(_readme_block("Register your own task", "python"))
    monkeypatch.syspath_prepend(str(tiny_dir))
    command = shlex.split(_readme_block("Saved as `my_tasks.py`", "bash").strip())
    assert command[:2] == ["rlvr", "train"] and "my_tasks:Squares-v0" in command
    command[command.index("--model") + 1] = str(tiny_dir / "model")
    tiny = ["--env.max_new_tokens", "2", "--env.eval_size", "2", "--env.use_chat_template", "false", "--run.progress",
            "false", "--run.tensorboard", "false", "--run.plots", "false", "--rollout.prompts_per_step", "2",
            "--rollout.group_size", "2", "--run.steps", "1", "--run.output_dir", str(tiny_dir / "squares")]
    assert main([*command[1:], *tiny]) == 0, capsys.readouterr().err
    recorded = (tiny_dir / "squares" / "config.yaml").read_text()
    assert "id: my_tasks:rlvr/Squares-v0" in recorded  # so --resume and rlvr eval find the task in a fresh process
    assert main(["eval", "--model", str(tiny_dir / "squares"), "--config", str(tiny_dir / "squares" / "config.yaml"),
                 "--num-problems", "2"]) == 0


def test_an_unknown_own_task_says_how_to_name_it_and_entry_points_register_tasks(tiny_dir, capsys, monkeypatch):
    from rlvr_env import registry

    assert _train(tiny_dir, "--env", "rlvr/Cubes-v0") == 2
    assert "name the module that registers it, e.g. my_package.tasks:rlvr/Cubes-v0" in capsys.readouterr().err
    assert _train(tiny_dir, "--env", "no_such_module:Cubes-v0") == 2
    assert "cannot import module 'no_such_module'" in capsys.readouterr().err

    class Entry:  # what importlib.metadata lists for a package declaring [project.entry-points."rlvr_env.tasks"]
        name, value = "cubes", "their_package:register"

        @staticmethod
        def load():
            from rlvr_env.tasks.arithmetic import ArithmeticTask
            return lambda: registry.register_task("Cubes", ArithmeticTask)

    monkeypatch.setattr(registry.importlib.metadata, "entry_points", lambda group: [Entry] if group == "rlvr_env.tasks" else [])
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    monkeypatch.setattr(registry, "_TASKS", dict(registry._TASKS))
    assert registry.resolve_id("Cubes-v0") == "rlvr/Cubes-v0"


def test_a_run_s_output_has_no_library_progress_bars(tiny_dir, capsys):
    """transformers' "Loading weights" and "Writing model shards" bars came between the run's own lines."""
    assert _train(tiny_dir, "--run.save_every", "1") == 0
    err = capsys.readouterr().err
    assert "Loading weights" not in err and "Writing model shards" not in err and "step 1/1 | " in err
