"""A run's config is resolved once, before any weights load, into a copy (algos/run/resolve.py): the config given stays
as it was, the trainer and config.yaml hold the copy, and the copy comes from the model's transformers config alone."""

from __future__ import annotations

import copy
import dataclasses
import shutil
import warnings

import pytest
import torch

from algos.algorithms.grpo import GRPOConfig, GRPOTrainer
from algos.config import load_config, load_file, to_dict
from algos.model import loading
from algos.rollout import ROLLOUT_ENGINES
from algos.run import loop
from algos.run import resolve as resolve_module
from algos.run.resolve import resolve_run_config
from algos.system import hardware
from algos.system.distributed import init_distributed
from rlvr_env.testing import saved_tiny_model


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return saved_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden_size=32, num_layers=1, num_heads=2)


def auto_config(model_path, output_dir, **extra):
    """A tiny run whose names and switches are all left for the run to pick: the task by its short name, the engine,
    the precision and compiled layers "auto"."""
    return load_config(GRPOConfig, overrides={
        "model.path": str(model_path), "env.id": "arithmetic", "env.kwargs": '{"digits": 1}', "env.max_new_tokens": "2",
        "env.use_chat_template": "false", "env.eval_size": "2", "run.output_dir": str(output_dir),
        "run.progress": "false", "run.tensorboard": "false", "run.plots": "false", "rollout.prompts_per_step": "2",
        "rollout.group_size": "2", "run.steps": "1", "rollout.backend": "auto", "model.autocast": "auto",
        "model.compile_layers": "auto", **extra})


def resolve(config, **options):
    """resolve_run_config of ``config`` (validated) in this process's world."""
    config.validate()
    return resolve_run_config(config, init_distributed(config.distributed, config.model.device), **options)


def test_the_config_given_stays_as_it_was_and_the_run_and_its_config_yaml_hold_the_resolved_copy(tiny_model_dir,
                                                                                                   tmp_path):
    config = auto_config(tiny_model_dir, tmp_path / "run")
    given = copy.deepcopy(to_dict(config))
    trainer = GRPOTrainer(config)
    assert to_dict(config) == given  # nothing written into the caller's config
    resolved = trainer.config
    assert resolved is trainer.run.config and resolved is not config
    assert resolved.env.id == "rlvr/Arithmetic-v0"
    assert resolved.rollout.backend == "hf"  # the CPU's engine
    assert resolved.model.autocast in (None, "bfloat16")  # what this CPU computes fast, never "auto"
    assert resolved.model.compile_layers == "off"  # compiled layers are a CUDA path
    assert resolved.distributed.world_size == 1
    assert load_file(tmp_path / "run" / "config.yaml") == to_dict(resolved)


def test_a_run_resolves_before_any_weights_load(tiny_model_dir, tmp_path, monkeypatch):
    events = []
    resolving, loading = loop.resolve_run_config, loop.load_policy
    monkeypatch.setattr(loop, "resolve_run_config", lambda *a, **k: events.append("resolve") or resolving(*a, **k))
    monkeypatch.setattr(loop, "load_policy", lambda *a, **k: events.append("load") or loading(*a, **k))
    GRPOTrainer(auto_config(tiny_model_dir, tmp_path / "run"))
    assert events == ["resolve", "load"]


def test_the_resolution_reads_the_models_config_and_no_weights(tiny_model_dir, tmp_path, monkeypatch):
    import transformers

    def no_weights(*args, **kwargs):
        raise AssertionError("resolving a config loaded weights")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    config = auto_config(tiny_model_dir, tmp_path / "run")
    run = resolve(config)
    assert run.device == torch.device("cpu") and run.config.rollout.backend == "hf"
    assert run.machine["compiled_layers"] is False and "precision" in run.machine
    assert run.config.model.autocast == run.machine["precision"]["autocast"]
    assert config.rollout.backend == config.model.autocast == "auto"  # the config given is untouched
    assert not (tmp_path / "run").exists()  # and nothing is written


def test_a_peft_adapter_directory_resolves_from_its_base_models_config(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model

    model, _ = loading.load_policy(tiny_model_dir, dtype=torch.float32, device="cpu")
    get_peft_model(model, LoraConfig(r=2, target_modules="all-linear")).save_pretrained(tmp_path / "adapter")
    assert not (tmp_path / "adapter" / "config.json").exists()  # an adapter only: its base named in adapter_config.json
    assert loading.load_model_config(tmp_path / "adapter").to_dict() == loading.load_model_config(tiny_model_dir).to_dict()


def test_a_run_directory_as_model_path_resolves_to_its_latest_models_directory_and_says_so(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "earlier"
    shutil.copytree(tiny_model_dir, run_dir / "checkpoint-3" / "model")
    with pytest.warns(UserWarning, match=f"model.path {run_dir} resolves to {run_dir / 'checkpoint-3' / 'model'}"):
        run = resolve(auto_config(run_dir, tmp_path / "run"))
    assert run.config.model.path == str(run_dir / "checkpoint-3" / "model")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a model directory itself, or the embedded model's alias: kept, said nothing
        assert resolve(auto_config(tiny_model_dir, tmp_path / "run")).config.model.path == str(tiny_model_dir)


def test_auto_picks_the_engine_from_the_models_config_and_an_explicit_engine_is_kept(tiny_model_dir, tmp_path,
                                                                                         monkeypatch):
    seen = []

    def engine_for_model(config, model_config):
        seen.append(model_config.hidden_size)
        config.rollout.backend = "hf"
        return "hf"

    monkeypatch.setattr(resolve_module, "resolve_rollout_backend", lambda config, device: "static")  # as on a GPU
    monkeypatch.setattr(resolve_module, "engine_for_model", engine_for_model)
    assert resolve(auto_config(tiny_model_dir, tmp_path / "run")).config.rollout.backend == "hf"
    assert seen == [32]  # the model's own config: hidden size 32
    resolve(auto_config(tiny_model_dir, tmp_path / "run", **{"rollout.backend": "static"}))
    assert seen == [32]  # an engine the config names is not second-guessed


def test_a_missing_engine_is_refused_unless_the_caller_brings_its_backend(tiny_model_dir, tmp_path, monkeypatch):
    missing = dataclasses.replace(ROLLOUT_ENGINES["vllm"], requires="a_module_that_is_not_installed")
    monkeypatch.setitem(ROLLOUT_ENGINES, "vllm", missing)
    config = auto_config(tiny_model_dir, tmp_path / "run", **{"rollout.backend": "vllm"})
    with pytest.raises(ValueError, match="config rollout.backend = 'vllm' needs a_module_that_is_not_installed"):
        resolve(config)
    assert resolve(config, custom_backend=True).config.rollout.backend == "vllm"


def test_the_precision_is_measured_on_the_models_shapes_and_compiled_layers_are_recorded(tiny_model_dir, tmp_path,
                                                                                             monkeypatch):
    probed = []
    monkeypatch.setattr(hardware, "cpu_half_speed", lambda dtype, model_config: probed.append(model_config) or (1.0, "x"))
    run = resolve(auto_config(tiny_model_dir, tmp_path / "run", **{"model.compile_layers": "on"}))
    assert [config.hidden_size for config in probed] == [32]
    assert run.config.model.compile_layers == "on" and run.machine["compiled_layers"] is True


def test_evaluating_a_saved_model_resolves_a_copy_as_training_does_for_the_directory_it_loads(tiny_model_dir, tmp_path,
                                                                                                monkeypatch):
    from algos.run import evaluation

    resolved = []
    monkeypatch.setattr(evaluation, "resolve_run_config",
                        lambda config, world: resolved.append(resolve_run_config(config, world)) or resolved[-1])
    config = auto_config("default", tmp_path / "run")  # a model.path evaluation does not load
    config.validate()
    given = copy.deepcopy(to_dict(config))
    accuracy = evaluation.evaluate_saved_model(config, tiny_model_dir)
    assert 0.0 <= accuracy <= 1.0
    assert to_dict(config) == given  # "auto" left for the next caller, not overwritten by this evaluation's picks
    [run] = resolved
    assert run.config.model.path == str(tiny_model_dir)  # the directory evaluated, resolved from its own config
    assert run.config.rollout.backend == "hf" and run.config.model.autocast == run.machine["precision"]["autocast"]
