"""A run killed after a checkpoint and resumed equals the uninterrupted run, bit for bit, with every piece of state
that moves between steps in play: a warm-up + decaying LR schedule, float16 loss scaling (its scale and growth
tracker), the adaptive KL coefficient, the optimizer's moments and the sampling RNG (the HF backend samples from
torch's global generator)."""

from __future__ import annotations

import pytest
import torch
import yaml
from reference_helpers import save_tiny_model

from algos.algorithms import grpo, ppo
from algos.algorithms.grpo import GRPOConfig
from algos.config import load_config
from algos.run.reporting import read_metrics, without_wall_times

TASK = '{"digits": 1, "terms": 2, "operators": "+", "prompt_template": "{expression}=", "format_weight": 0.0}'
COMMON = {
    "env.kwargs": TASK, "env.max_new_tokens": "4", "env.use_chat_template": "false", "env.eval_size": "4",
    "optim.lr": "1e-3", "optim.warmup_steps": "1", "optim.schedule": "cosine", "model.autocast": "float16",
    "run.steps": "4", "run.save_every": "2", "run.progress": "false", "run.tensorboard": "false", "run.plots": "false",
}
ALGORITHMS = {
    "grpo": (grpo.GRPOTrainer, GRPOConfig, {"rollout.prompts_per_step": "2", "rollout.group_size": "4",
                                             "loss.micro_batch_size": "3", "grpo.num_iterations": "2", "grpo.beta": "0.04"}),
    # The GPU's engine (its own float16 copy of the weights, refreshed in place each step; CUDA graphs on a GPU,
    # where model.device "auto" puts this run)
    "grpo_static": (grpo.GRPOTrainer, GRPOConfig, {"rollout.prompts_per_step": "2", "rollout.group_size": "4",
                                                    "loss.micro_batch_size": "3", "grpo.beta": "0.04",
                                                    "rollout.backend": "static"}),
    "ppo": (ppo.PPOTrainer, ppo.PPOConfig, {"rollout.prompts_per_step": "4", "rollout.group_size": "2",
                                            "loss.micro_batch_size": "3", "ppo.kl_target": "0.01",
                                            "ppo.value_model": "separate", "ppo.critic_warmup_steps": "1"}),
}


class Killed(Exception):
    pass


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def trainer_state(trainer) -> dict:
    """Everything a step reads that an earlier step wrote."""
    modules = trainer.modules if hasattr(trainer, "modules") else trainer.model
    state = {
        "weights": {k: v.clone() for k, v in modules.state_dict().items()},
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
        "scaler": trainer.scaler.state_dict(),
        "rng": torch.get_rng_state(),
    }
    if hasattr(trainer, "kl_controller"):
        state["kl_controller"] = trainer.kl_controller.state_dict()
    return state


def assert_same(a, b, path="state"):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_a_killed_run_resumes_to_the_uninterrupted_runs_state(algo, model_dir, tmp_path, monkeypatch):
    trainer_cls, config_cls, extra = ALGORITHMS[algo]

    def config(name):
        overrides = {**COMMON, **extra, "model.path": model_dir, "run.output_dir": str(tmp_path / name)}
        return load_config(config_cls, overrides=overrides)

    straight = trainer_cls(config("straight"))
    straight.train()

    save = trainer_cls.save

    def save_then_die(self, step):
        path = save(self, step)
        if step == 2:
            raise Killed  # nothing after checkpoint-2 survives, as with SIGKILL
        return path

    monkeypatch.setattr(trainer_cls, "save", save_then_die)
    with pytest.raises(Killed):
        trainer_cls(config("resumed")).train()
    monkeypatch.setattr(trainer_cls, "save", save)
    resumed = trainer_cls(config("resumed"), resume=True)
    assert resumed.start_step == 2
    resumed.train()

    assert_same(trainer_state(straight), trainer_state(resumed))
    rows = [without_wall_times(read_metrics(tmp_path / name)) for name in ("straight", "resumed")]
    assert rows[0] == rows[1]
    # The state really moved: the schedule decayed, loss scaling counted its finite steps, the KL coefficient adapted.
    lrs = [r["lr"] for r in rows[0] if "lr" in r]
    assert len(set(lrs)) > 1
    assert straight.scaler.state_dict()["_growth_tracker"] > 0
    if algo == "ppo":
        assert straight.kl_controller.coef != 0.05


@pytest.mark.parametrize(("trained_in", "resumed_in"), [("float16", "null"), ("null", "float16")])
def test_a_run_resumes_in_another_precision(trained_in, resumed_in, model_dir, tmp_path):
    """A bf16 or fp16 run resumed on a machine where "auto" picks another precision (an AVX2 CPU: fp32) goes on
    there; fp16's loss-scaling state is kept where it applies and started afresh where it did not exist."""
    trainer_cls, config_cls, extra = ALGORITHMS["grpo"]

    def config(autocast, steps):
        overrides = {**COMMON, **extra, "model.path": model_dir, "run.output_dir": str(tmp_path),
                     "model.autocast": autocast, "run.steps": steps}
        return load_config(config_cls, overrides=overrides)

    trainer_cls(config(trained_in, "2")).train()
    resumed = trainer_cls(config(resumed_in, "4"), resume=True)
    assert resumed.start_step == 2 and resumed.scaler.is_enabled() == (resumed_in == "float16")
    resumed.train()
    saved = yaml.safe_load((tmp_path / "checkpoint-4" / "config.yaml").read_text())
    assert saved["model"]["autocast"] == (None if resumed_in == "null" else resumed_in)
