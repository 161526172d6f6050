"""algos.run.directory without a model: what a fresh start, an overwrite and a resume refuse, say and write."""

import re
from pathlib import Path

import pytest
import yaml

from algos.algorithms.grpo import GRPOConfig
from algos.config import load_config, save_config
from algos.run.directory import RESUME_OVERRIDES, check_resumable, open_run_dir


def _config(tmp_path, **overrides):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")  # a transformers directory, as far as resolve_model_path looks
    return load_config(GRPOConfig, overrides={"model.path": str(model), "run.output_dir": str(tmp_path / "runs" / "a" / "b"),
                                              "run.steps": "4", **overrides})


def _checkpoint(config, step: int, stored=None):
    """A checkpoint-<step> directory holding ``stored`` (default: ``config``) as its config.yaml."""
    path = config_dir(config) / f"checkpoint-{step}"
    path.mkdir(parents=True)
    save_config(stored or config, path / "config.yaml")
    return path


def config_dir(config) -> Path:
    return Path(config.run.output_dir)


def test_a_fresh_start_creates_nested_directories_and_writes_the_config(tmp_path):
    config = _config(tmp_path)
    assert open_run_dir(config, resume=False) is None
    assert load_config(GRPOConfig, config_dir(config) / "config.yaml") == config


def test_a_resume_without_checkpoints_says_it_starts_at_step_0(tmp_path):
    config = _config(tmp_path)
    where = re.escape(str(config_dir(config)))
    with pytest.warns(UserWarning, match=rf"^--resume: no checkpoint in {where}, starting at step 0$"):
        assert open_run_dir(config, resume=True) is None


def test_a_fresh_start_beside_checkpoints_is_refused_or_overwrites_them(tmp_path):
    config = _config(tmp_path)
    _checkpoint(config, 2)
    refusal = (r"^run.output_dir .* holds checkpoint-2 of an earlier run: resume it \(--resume\), "
               r"choose another run.output_dir, or set run.overwrite_output_dir to delete its checkpoints$")
    with pytest.raises(ValueError, match=refusal):
        open_run_dir(config, resume=False)
    config.run.overwrite_output_dir = True
    assert open_run_dir(config, resume=False) is None
    assert not (config_dir(config) / "checkpoint-2").exists()


def test_an_overwrite_never_deletes_the_model_it_trains(tmp_path):
    config = _config(tmp_path, **{"run.overwrite_output_dir": "true"})
    inside = config_dir(config) / "checkpoint-1" / "model"
    inside.mkdir(parents=True)
    (inside / "config.json").write_text("{}")
    config.model.path = str(inside)
    with pytest.raises(ValueError, match=r"^model.path .* is inside run.output_dir .*, whose checkpoints "
                                         r"run.overwrite_output_dir would delete: choose another run.output_dir$"):
        open_run_dir(config, resume=False)
    assert inside.is_dir()


def test_a_resume_needs_the_checkpoints_own_config(tmp_path):
    config = _config(tmp_path)
    checkpoint = _checkpoint(config, 2)
    (checkpoint / "config.yaml").unlink()
    with pytest.raises(ValueError, match=rf"^cannot resume {re.escape(str(checkpoint))}: it holds no config.yaml, "
                                         r"the config it was trained with$"):
        check_resumable(config, checkpoint)
    (checkpoint / "config.yaml").write_text(yaml.safe_dump({"grpo": {"bogus": 1}}))
    with pytest.raises(ValueError, match=r"^cannot resume .*checkpoint-2: .*config.yaml is not a GRPOConfig "
                                         r"\(unknown config key 'grpo.bogus'"):
        check_resumable(config, checkpoint)


def test_a_changed_config_lists_eight_differences_and_what_may_change(tmp_path):
    config = _config(tmp_path)
    changed = _config(tmp_path, **{"rollout.prompts_per_step": "3", "rollout.group_size": "3"},
                      **{f"grpo.{key}": value for key, value in (
                          ("num_iterations", "3"), ("beta", "0.5"), ("kl_clamp", "3"), ("adv_eps", "0.5"),
                          ("process_weight", "0.5"), ("max_sampling_rounds", "3"), ("overlong_cache", "3"))})
    checkpoint = _checkpoint(config, 2)
    with pytest.raises(ValueError) as refused:
        check_resumable(changed, checkpoint)
    message = str(refused.value)
    listed = message[message.index("(") + 1 : message.index(")")]
    assert listed.split("; ") == [
        "grpo.adv_eps: 1e-06 -> 0.5", "grpo.beta: 0.04 -> 0.5", "grpo.kl_clamp: 10.0 -> 3.0",
        "grpo.max_sampling_rounds: 4 -> 3", "grpo.num_iterations: 1 -> 3", "grpo.overlong_cache: 16 -> 3",
        "grpo.process_weight: 0.0 -> 0.5", "rollout.group_size: 8 -> 3",
    ]  # the first eight, sorted; rollout.prompts_per_step is the ninth
    assert message.endswith(f"A resumed run may change only {', '.join(sorted(RESUME_OVERRIDES))}")
    assert f"pass --config {checkpoint / 'config.yaml'}." in message


def test_a_resume_may_change_the_overrides_but_not_go_back(tmp_path):
    config = _config(tmp_path)
    checkpoint = _checkpoint(config, 4)
    longer = _config(tmp_path, **{"run.steps": "6", "run.eval_every": "2", "env.eval_batch_size": "8",
                                  "model.compile_layers": "on"})  # a CPU run ("off") going on on a GPU
    check_resumable(longer, checkpoint)
    with pytest.warns(UserWarning, match=r"already has run.steps = 4 steps; nothing to train \(raise run.steps to continue\)$"):
        check_resumable(config, checkpoint)
    with pytest.raises(ValueError, match=r"with run.steps = 3: it has trained 4 steps$"):
        check_resumable(_config(tmp_path, **{"run.steps": "3"}), checkpoint)


def test_a_key_whose_default_is_what_older_runs_did_resumes_at_it_and_any_other_missing_key_is_refused(tmp_path):
    """env.chat_template_kwargs came after runs whose prompts had no template variables ({}, its default); a key
    without that guarantee (grpo.beta) stays refused when the stored config lacks it."""
    config = _config(tmp_path)
    checkpoint = _checkpoint(config, 2)
    saved = yaml.safe_load((checkpoint / "config.yaml").read_text())
    del saved["env"]["chat_template_kwargs"]
    (checkpoint / "config.yaml").write_text(yaml.safe_dump(saved))
    check_resumable(config, checkpoint)
    with pytest.raises(ValueError, match=r"env.chat_template_kwargs: \{\} -> \{'enable_thinking': False\}"):
        check_resumable(_config(tmp_path, **{"env.chat_template_kwargs.enable_thinking": "false"}), checkpoint)
    del saved["grpo"]["beta"]
    (checkpoint / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(ValueError, match=r"config.yaml has no grpo.beta \(it was written before the key existed"):
        check_resumable(config, checkpoint)
