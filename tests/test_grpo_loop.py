"""The GRPO/DAPO loop's guarantees: exact resume after SIGKILL, NaN guard, dynamic-sampling bound,
process supervision."""

import json
import math
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

import rlvr_env
from algos.algorithms.grpo import DAPO_PRESET, GRPOConfig, GRPOTrainer, train
from algos.config import load_config
from algos.core import POLICY_LOSSES
from algos.core.advantages import group_advantages, process_advantages
from algos.run import loop
from algos.run.reporting import COMPLETIONS_FILE, read_metrics, without_wall_times
from algos.system.paths import latest_checkpoint, list_checkpoints
from rlvr_env.testing import saved_tiny_model

TASK = '{"digits": 1, "terms": 2, "operators": "+", "prompt_template": "{expression}=", "format_weight": 0.0}'
THREE_DIGITS = TASK.replace('"digits": 1', '"digits": 3')  # sums an untrained model never guesses


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return saved_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden_size=32, num_layers=1, num_heads=2)


def overrides(model_dir, output_dir, **extra):
    base = {
        "model.path": str(model_dir), "model.autocast": "null",
        "env.kwargs": TASK, "env.max_new_tokens": "4", "env.use_chat_template": "false",
        "env.eval_size": "8", "optim.lr": "1e-3", "run.output_dir": str(output_dir), "run.progress": "false",
        "run.tensorboard": "false", "run.plots": "false", "rollout.prompts_per_step": "4", "rollout.group_size": "4",
        "loss.micro_batch_size": "5", "grpo.num_iterations": "2", "grpo.beta": "0.04", "grpo.overlong_cache": "2",
    }
    return {**base, **extra}


RESUME_RUN = {"run.steps": "4", "run.save_every": "1"}


def _cli(model_dir, output_dir, *extra):
    args = [f"--{k}={v}" for k, v in overrides(model_dir, output_dir, **RESUME_RUN).items()]
    return [sys.executable, "-m", "rlvr_cli", "train", "--algo", "grpo", *args, *extra]


@pytest.mark.slow
def test_sigkilled_run_resumes_to_the_same_parameters_bitwise(tiny_model_dir, tmp_path):
    train(load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path / "full", **RESUME_RUN)))

    proc = subprocess.Popen(_cli(tiny_model_dir, tmp_path / "killed"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (tmp_path / "killed" / "checkpoint-2").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "training ended before it could be killed"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    resumed = subprocess.run(_cli(tiny_model_dir, tmp_path / "killed", "--resume"), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    final = {name: latest_checkpoint(tmp_path / name) for name in ("full", "killed")}
    assert final["full"].name == final["killed"].name == "checkpoint-4"
    want = load_file(final["full"] / "model" / "model.safetensors")
    got = load_file(final["killed"] / "model" / "model.safetensors")
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert without_wall_times(read_metrics(tmp_path / "killed")) == without_wall_times(read_metrics(tmp_path / "full"))
    # what the model wrote: the resumed run drew steps 3-4 again from their seeds, over what the killed one had written
    written = read_metrics(tmp_path / "full", COMPLETIONS_FILE)
    assert [r["step"] for r in written] == [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4
    assert read_metrics(tmp_path / "killed", COMPLETIONS_FILE) == written


@pytest.mark.parametrize("tensorboard", [False, True])
def test_a_runs_summary_names_its_directory_and_curves_and_its_step_times_are_each_steps_own(tiny_model_dir, tmp_path,
                                                                                          tensorboard):
    """run_training's summary holds output_dir and the curves' PNG (run.plots); step_time_s is each step's own wall
    time, so the steps' sum fits in the run's, and its parts fit in it: drawing the batch (time/rollout_s), the rest of
    the step (time/update_s) and, on a step that evaluates, the evaluation (time/eval_s; the last step's comes after
    its step_time_s); run.tensorboard writes event files or none."""
    pytest.importorskip("tensorboard")
    config = load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{
        "run.steps": "3", "run.eval_every": "2", "run.plots": "true", "run.tensorboard": str(tensorboard).lower(),
        "grpo.num_iterations": "1"}))
    started = time.perf_counter()
    summary = train(config)
    elapsed = time.perf_counter() - started
    assert summary["output_dir"] == str(tmp_path)
    assert summary["plot"] == tmp_path / "curves.png" and summary["plot"].is_file()
    records = read_metrics(tmp_path)
    steps = [record for record in records if "step_time_s" in record]
    assert len(steps) == 3 and sum(record["step_time_s"] for record in steps) < elapsed
    for record in steps:
        evaluated = record["time/eval_s"] if record["step"] == 2 else 0.0
        assert 0 < record["time/rollout_s"] and 0 < record["time/update_s"]
        assert record["time/rollout_s"] + record["time/update_s"] + evaluated <= record["step_time_s"]
    assert [record["step"] for record in steps if "time/eval_s" in record] == [2, 3]
    assert 0 < steps[-1]["time/eval_s"] < elapsed - sum(record["step_time_s"] for record in steps)
    assert (records[0]["world_size"], records[0]["distributed_strategy"]) == (1, "none")  # one process: no strategy ran
    assert any((tmp_path / "tensorboard").glob("events.*")) == tensorboard


def test_log_completions_writes_each_steps_first_rows_as_they_were_scored(tiny_model_dir, tmp_path):
    config = load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{
        "run.steps": "2", "grpo.num_iterations": "1", "run.log_completions": "3"}))
    train(config)
    written = read_metrics(tmp_path, COMPLETIONS_FILE)
    assert [(r["step"], r["row"], r["group"]) for r in written] == [(1, 0, 0), (1, 1, 0), (1, 2, 0), (2, 0, 0), (2, 1, 0),
                                                                   (2, 2, 0)]  # groups of 4 rows
    task = rlvr_env.make_task("Arithmetic", **json.loads(TASK))
    for record in written:
        assert set(record) == {"step", "row", "group", "prompt", "completion", "answer", "score", "status", "components",
                               "truncated"}
        rescored = task.verifier(record["completion"], answer=record["answer"])
        assert (record["score"], record["status"], record["components"]) == (
            pytest.approx(rescored.score), rescored.status, pytest.approx(rescored.details["components"]))
    assert written[0]["prompt"] == written[1]["prompt"] == written[2]["prompt"]  # one group's rows: one prompt
    config.run.log_completions, config.run.output_dir = 0, str(tmp_path / "none")
    train(config)
    assert not (tmp_path / "none" / COMPLETIONS_FILE).exists()


def test_eval_samples_logs_pass_at_k_and_majority_beside_the_greedy_accuracy(tiny_model_dir, tmp_path):
    config = load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{
        "run.steps": "2", "run.eval_every": "1", "grpo.num_iterations": "1", "env.eval_samples": "3"}))
    summary = train(config)
    evaluations = [record for record in read_metrics(tmp_path) if "eval_accuracy" in record]
    assert [record["step"] for record in evaluations] == [0, 1, 2]
    for record in evaluations:
        assert 0 <= record["eval_pass@1"] <= record["eval_pass@2"] <= record["eval_pass@3"] <= 1
        assert 0 <= record["eval_maj@3"] <= 1
    assert summary["eval_pass@3_after"] == evaluations[-1]["eval_pass@3"]


@pytest.mark.parametrize(("metrics", "wait"), [
    ({"time/rollout_s": 2.5, "loss": 0.1}, 2.5),  # a synchronous step drew its batch
    ({"async/learner_wait_s": 0.75, "async/draw_s": 3.0}, 0.75),  # the actor drew it ahead: only the wait is the step's
    ({"loss": 0.1}, 0.0),  # a step that logs neither (a custom agent) spent nothing apart from its update
])
def test_a_steps_batch_wait_is_its_draw_or_its_wait_for_the_actor(metrics, wait):
    assert loop.batch_wait_s(metrics) == wait


def test_a_fresh_run_refuses_a_directory_with_another_runs_checkpoints(tiny_model_dir, tmp_path):
    config = load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{"run.steps": "2"}))
    GRPOTrainer(config).save(1)
    with pytest.raises(ValueError, match=r"run.output_dir .* holds checkpoint-1 .*--resume"):
        GRPOTrainer(config)
    assert GRPOTrainer(config, resume=True).start_step == 1
    config.run.overwrite_output_dir = True
    assert GRPOTrainer(config).start_step == 0 and not list_checkpoints(tmp_path)


def test_resume_refuses_a_changed_config_but_allows_a_longer_run(tiny_model_dir, tmp_path):
    GRPOTrainer(load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{"run.steps": "2"}))).save(1)
    for key, value in (("optim.lr", "0.05"), ("rollout.group_size", "2"), ("env.kwargs", "{digits: 2}")):
        changed = load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{"run.steps": "2", key: value}))
        with pytest.raises(ValueError, match=rf"cannot resume .*checkpoint-1 .*\({re.escape(key)}: .*--config"):
            GRPOTrainer(changed, resume=True)
    assert load_config(GRPOConfig, tmp_path / "config.yaml").optim.lr == 1e-3  # the refused run did not overwrite it
    longer = load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{"run.steps": "5", "run.progress": "true"}))
    assert GRPOTrainer(longer, resume=True).start_step == 1


def test_nonfinite_loss_skips_the_update_and_leaves_weights_intact(tiny_model_dir, tmp_path):
    trainer = GRPOTrainer(load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{"run.steps": "1"})))
    assert not any(p.requires_grad for p in trainer.ref_model.parameters())  # grpo.beta > 0: a frozen reference
    batch, _ = trainer.collect(step=1)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    batch.advantages[0] = math.nan
    stats = trainer.update(batch)
    assert stats["skipped_update"] == 1.0 and math.isnan(stats["loss"])
    assert all(torch.equal(a, b) for a, b in zip(trainer.model.parameters(), before))
    batch.advantages[0] = 1.0
    assert trainer.update(batch)["skipped_update"] == 0.0
    assert any(not torch.equal(a, b) for a, b in zip(trainer.model.parameters(), before))


def test_batch_without_loss_tokens_takes_no_optimizer_step(tiny_model_dir, tmp_path):
    trainer = GRPOTrainer(load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{"run.steps": "3"})))
    batch, _ = trainer.collect(step=1)
    assert trainer.update(batch)["skipped_update"] == 0.0  # AdamW now has momentum
    before = [p.detach().clone() for p in trainer.model.parameters()]
    optimizer_steps = [state["step"].clone() for state in trainer.optimizer.state.values()]
    batch.loss_mask.zero_()  # e.g. every row truncated under overlong filtering
    stats = trainer.update(batch)
    assert stats["skipped_update"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(trainer.model.parameters(), before))
    assert [state["step"] for state in trainer.optimizer.state.values()] == optimizer_steps
    assert trainer.scheduler.last_epoch == 2  # the schedule still follows the step count


def test_a_skipped_first_update_advances_the_schedule_without_a_warning(tiny_model_dir, tmp_path):
    trainer = GRPOTrainer(load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{"run.steps": "3"})))
    batch, _ = trainer.collect(step=1)
    batch.loss_mask.zero_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "lr_scheduler.step() before optimizer.step()" would raise here
        assert trainer.update(batch)["skipped_update"] == 1.0
    assert trainer.scheduler.last_epoch == 1


def test_dynamic_sampling_bound_with_no_signal_skips_the_step(tiny_model_dir, tmp_path):
    # An untrained model does not guess 3-digit sums (odds ~1e-6 a row): every group's accuracy is
    # all 0. The soft overlong penalty (on in the preset) gives the shaped rewards length-driven
    # variance, which is no signal about correctness: those groups are still dropped.
    extra = {"run.steps": "1", "grpo.max_sampling_rounds": "3", "grpo.beta": "0", "env.kwargs": THREE_DIGITS}
    config = load_config(
        GRPOConfig,
        overrides=overrides(tiny_model_dir, tmp_path, **extra),
        preset=DAPO_PRESET,
    )
    trainer = GRPOTrainer(config)
    batch, stats = trainer.collect(step=1)
    assert batch is None
    assert stats["generation_rounds"] == 3 and stats["kept_groups"] == 0
    assert stats["zero_std_group_frac"] < 1.0  # the shaped rewards did vary
    assert trainer.ref_model is None  # beta = 0: no reference copy is kept


def test_overlong_filter_masks_truncated_rows(tiny_model_dir, tmp_path):
    config = load_config(
        GRPOConfig,
        overrides=overrides(
            tiny_model_dir, tmp_path, **{"grpo.overlong_filter": "true", "grpo.soft_overlong": "true", "env.kwargs": THREE_DIGITS}
        ),
    )
    trainer = GRPOTrainer(config)
    batch, stats = trainer.collect(step=1)
    filtered = batch.loss_mask.sum(-1) == 0
    assert stats["truncation_rate"] > 0  # an untrained model rarely stops within 4 tokens
    assert filtered.float().mean().item() == pytest.approx(stats["truncation_rate"])
    # soft penalty with L_max 4, L_cache 2: a truncated (length 4) row's R_len is -1, weighted 0.5 (DAPO's weight on
    # +-1 rewards); its task score is 0 (3-digit sums)
    assert torch.all(batch.scores[filtered] == -0.5)


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_half_autocast_trains_fp32_weights_on_half_matmuls(half, tiny_model_dir, tmp_path):
    config = load_config(
        GRPOConfig,
        # an untrained model's groups have no reward variance; the entropy bonus still moves the weights
        overrides=overrides(tiny_model_dir, tmp_path, **{"run.steps": "1", "model.autocast": half, "loss.entropy_coef": "0.01"}),
    )
    trainer = GRPOTrainer(config)  # its start-up LM-head probe runs in fp32, before training
    linear_out = set()
    record = lambda module, args, out: linear_out.add(out.dtype) if isinstance(module, torch.nn.Linear) else None  # noqa: E731
    handle = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        summary = trainer.train()
    finally:
        handle.remove()
    assert linear_out == {getattr(torch, half)}  # rollouts, evaluation and the update all ran under autocast
    initial = load_file(tiny_model_dir / "model.safetensors")
    trained = load_file(latest_checkpoint(tmp_path) / "model" / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in trained.values())  # master weights stay fp32
    assert any(not torch.equal(initial[k], trained[k]) for k in initial)
    last = read_metrics(tmp_path)[-1]
    assert last["skipped_update"] == 0.0 and math.isfinite(last["loss"])
    assert 0.0 <= summary["eval_accuracy_after"] <= 1.0
    # float16 trains under loss scaling, whose scale a resumed run continues from
    scaler_state = torch.load(latest_checkpoint(tmp_path) / "trainer.pt", weights_only=False)["state"]["grad_scaler"]
    assert (scaler_state["scale"] == 65536.0) if half == "float16" else scaler_state == {}


def test_gradient_checkpointing_trains_to_the_same_weights(tiny_model_dir, tmp_path):
    """model.gradient_checkpointing changes where activations live, not what a step computes."""
    trained = {}
    for checkpointing in ("false", "true"):
        run = tmp_path / checkpointing
        config = load_config(GRPOConfig, overrides=overrides(tiny_model_dir, run, **{
            "run.steps": "2", "model.gradient_checkpointing": checkpointing, "loss.entropy_coef": "0.01"}))
        trainer = GRPOTrainer(config)
        assert trainer.model.is_gradient_checkpointing == (checkpointing == "true")
        trainer.train()
        trained[checkpointing] = load_file(latest_checkpoint(run) / "model" / "model.safetensors")
    initial = load_file(tiny_model_dir / "model.safetensors")
    assert any(not torch.equal(initial[k], trained["true"][k]) for k in initial)
    for key, weight in trained["false"].items():
        # Float rounding, which Adam scales up where a gradient is near 0 (its step is lr x g / |g|): measured up to
        # 0.3% of a 1e-3 step on AMX kernels, 1.6% (1.57e-5) on AVX2. A recompute that computed something else would
        # move most weights by a large share of the step.
        torch.testing.assert_close(trained["true"][key], weight, atol=3e-5, rtol=1e-4)


def test_gradient_checkpointing_on_a_model_that_cannot_names_the_key_and_the_model(tiny_model_dir, tmp_path,
                                                                                   monkeypatch):
    from transformers import LlamaForCausalLM

    monkeypatch.setattr(LlamaForCausalLM, "supports_gradient_checkpointing", False)
    config = load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{
        "model.gradient_checkpointing": "true"}))
    with pytest.raises(ValueError, match=r"^config model.gradient_checkpointing: LlamaForCausalLM does not support it$"):
        GRPOTrainer(config)


def test_a_runs_rows_stop_at_its_models_generation_config_eos_ids(tmp_path):
    """An instruct model that ends its turn on a token besides its tokenizer's EOS (Qwen2.5's <|endoftext|>, Llama 3's
    <|eot_id|>) says so in generation_config.json: the run's env stops its rows there too."""
    from transformers import GenerationConfig

    model_dir = saved_tiny_model(tmp_path / "model", hidden_size=16, num_layers=1, num_heads=2)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    end_of_turn = tokenizer.convert_tokens_to_ids("#")
    GenerationConfig(eos_token_id=[tokenizer.eos_token_id, end_of_turn]).save_pretrained(model_dir)
    trainer = GRPOTrainer(load_config(GRPOConfig, overrides=overrides(model_dir, tmp_path / "run")))
    assert sorted(trainer.run.env.stop_ids.tolist()) == sorted([tokenizer.eos_token_id, end_of_turn])


def test_a_run_on_a_dataset_without_an_eval_file_warns_that_it_scores_training_problems(tiny_model_dir, tmp_path):
    dataset = Path(__file__).parent / "data" / "gsm8k_tiny.jsonl"
    config = overrides(tiny_model_dir, tmp_path / "run", **{"env.id": "rlvr/GSM8K-v0", "env.kwargs": f"{{data_path: {dataset}}}"})
    with pytest.warns(UserWarning, match="rlvr/GSM8K-v0 is a fixed dataset and env.eval_kwargs is empty"):
        GRPOTrainer(load_config(GRPOConfig, overrides=config))
    config["env.eval_kwargs"], config["run.output_dir"] = f"{{data_path: {dataset}}}", str(tmp_path / "held_out")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        GRPOTrainer(load_config(GRPOConfig, overrides=config))


def test_autocast_must_name_a_half_dtype(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="model.autocast"):
        load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{"model.autocast": "float64"})).validate()


def test_mixed_precision_forwards_see_every_weight_update():
    # One context spans a whole run: a forward after an optimizer step must use the new weights,
    # including when the previous forward ran under no_grad (a rollout) and the next one trains.
    from algos.config import ModelConfig
    from algos.system.runtime import mixed_precision

    layer, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    with mixed_precision(ModelConfig(autocast="bfloat16"), torch.device("cpu")):
        with torch.no_grad():
            before = layer(x)
            layer.weight.add_(1.0)
        after = layer(x)
        after.sum().backward()
    assert before.dtype == after.dtype == torch.bfloat16
    assert not torch.equal(before, after.detach())
    assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0


def test_a_rollout_casts_each_weight_once_and_the_next_forward_sees_the_update():
    from algos.config import ModelConfig
    from algos.system.runtime import mixed_precision, weights_cast_once

    layer, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    with mixed_precision(ModelConfig(autocast="bfloat16"), torch.device("cpu")):
        with torch.no_grad():
            with weights_cast_once("cpu"):
                first = layer(x)
                layer.weight.add_(1.0)  # never done inside a rollout: here it shows the first cast is reused
                second = layer(x)
            assert torch.equal(first, second) and first.dtype == torch.bfloat16
        after = layer(x)  # the update's forward
    assert not torch.equal(first, after.detach())  # the cache was cleared: the changed weights were cast anew
    with weights_cast_once("cpu"):  # outside autocast: nothing to cache
        assert layer(x).dtype == torch.float32


def test_an_accumulation_casts_each_weight_once_with_the_gradients_of_casting_per_forward():
    from algos.config import ModelConfig
    from algos.system.distributed import accumulation_passes
    from algos.system.runtime import mixed_precision

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    x = torch.randn(6, 8)
    micro = [slice(0, 2), slice(2, 4), slice(4, 6)]

    def gradients(passes):
        model.zero_grad()
        outputs = []
        with mixed_precision(ModelConfig(autocast="bfloat16"), torch.device("cpu")):
            for rows in passes:
                out = model(x[rows])
                outputs.append(out.detach())
                out.float().square().sum().backward()
        return outputs, [p.grad.clone() for p in model.parameters()]

    want_outputs, want = gradients(micro)  # a cast per forward
    got_outputs, got = gradients(accumulation_passes(model, micro, "cpu"))
    assert all(torch.equal(g, w) for g, w in zip(got + got_outputs, want + want_outputs))
    with mixed_precision(ModelConfig(autocast="bfloat16"), torch.device("cpu")), torch.no_grad():
        outputs = []
        for _ in accumulation_passes(model, micro[:2], "cpu"):
            outputs.append(model(x[micro[0]]))
            model[0].weight.add_(1.0)  # never done mid-accumulation: here it shows the first cast is reused
        assert torch.equal(outputs[0], outputs[1])
        assert not torch.equal(model(x[micro[0]]), outputs[0])  # after the accumulation the changed weights are cast anew


COUNTDOWN = '{"num_numbers": 3, "step_reward": 0.1}'


class ScriptedBackend:
    """Writes each group's rows from a script: row j of every group gets ``texts(problem)[j]``, then EOS."""

    def __init__(self, texts):
        self.texts = texts

    def generate(self, model, env, **sampling):
        scripts = [self.texts(problem)[row % env.group_size] for row, problem in enumerate(env.problems)]
        plans = [[env.tokenizer.convert_tokens_to_ids(ch) for ch in text] for text in scripts]
        step = 0
        while not env.all_done:
            env.step(torch.tensor([p[step] if step < len(p) else env.tokenizer.eos_token_id for p in plans]))
            step += 1
        self.result = env.results()
        return self.result


def test_process_supervision_adds_normalised_step_rewards_to_the_outcome_advantage(tiny_model_dir, tmp_path):
    extra = {"env.id": "rlvr/Countdown-v0", "env.kwargs": COUNTDOWN, "env.max_new_tokens": "24", "grpo.process_weight": "0.5"}
    trainer = GRPOTrainer(load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **extra)))

    def texts(problem):
        a, b, _ = problem.answer["numbers"]
        # a valid line of working, an invalid one, and two rows with no step before the final one
        return [f"{a} + {b} = {a + b}\nso", f"{a} + {b} = {a + b + 1}\nso", "so", "no"]

    trainer.backend = ScriptedBackend(texts)
    batch, _ = trainer.collect(step=1)
    result = trainer.backend.result
    assert batch.advantages.shape == batch.loss_mask.shape  # [N, T]: one advantage per token
    assert result.process_rewards.sum().item() == pytest.approx(0.1 * 4)  # one valid line in each of the 4 groups
    outcome = group_advantages(batch.scores, 4, eps=1e-6)
    process = process_advantages(result.process_rewards, result.process_step_mask, 4, eps=1e-6)
    assert torch.allclose(batch.advantages, outcome[:, None] + 0.5 * process)
    valid_text, invalid_text = texts(result.problems[0])[:2]
    valid, invalid = batch.advantages[0], batch.advantages[1]
    assert valid[0].item() > invalid[0].item()  # the valid step's credit reaches the tokens before it
    after = valid_text.index("\n") + 1, invalid_text.index("\n") + 1
    assert valid[after[0]].item() == pytest.approx(invalid[after[1]].item())  # and nothing after it
    assert trainer.update(batch)["skipped_update"] == 0.0


def test_dynamic_sampling_keeps_groups_whose_step_rewards_differ(tiny_model_dir, tmp_path):
    extra = {"env.id": "rlvr/Countdown-v0", "env.kwargs": COUNTDOWN, "env.max_new_tokens": "24",
             "grpo.dynamic_sampling": "true", "grpo.max_sampling_rounds": "1"}

    def texts(problem):  # every answer wrong (accuracy all 0); one valid line of working per group
        a, b, _ = problem.answer["numbers"]
        return [f"{a} + {b} = {a + b}\nso", "so", "so", "no"]

    kept = {}
    for weight in ("0", "1"):
        trainer = GRPOTrainer(load_config(GRPOConfig, overrides=overrides(
            tiny_model_dir, tmp_path / weight, **extra, **{"grpo.process_weight": weight})))
        trainer.backend = ScriptedBackend(texts)
        kept[weight] = trainer.collect(step=1)[1]["kept_groups"]
    assert kept == {"0": 0, "1": 4}


def test_process_supervision_needs_a_task_with_process_rewards(tiny_model_dir, tmp_path):
    config = load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{"grpo.process_weight": "1"}))
    with pytest.raises(ValueError, match="grpo.process_weight"):
        GRPOTrainer(config)
    assert not (tmp_path / "config.yaml").exists()  # refused before the run directory was written


ARITHMETIC_WITH_FORMAT_CREDIT = '{"digits": 1, "terms": 2, "operators": "+", "prompt_template": "{expression}="}'


def test_dynamic_sampling_filters_on_accuracy_unless_told_to_filter_on_the_score(tiny_model_dir, tmp_path):
    """Every row right, two of four boxed: scores 1.0/0.9 vary on format credit alone; DAPO drops such groups."""
    def texts(problem):
        return [f"\\boxed{{{problem.answer}}}"] * 2 + [str(problem.answer)] * 2

    kept = {}
    for metric in ("acc", "score"):
        extra = {"env.kwargs": ARITHMETIC_WITH_FORMAT_CREDIT, "env.max_new_tokens": "20", "grpo.max_sampling_rounds": "1",
                 "grpo.dynamic_sampling": "true", "grpo.dynamic_sampling_metric": metric}
        trainer = GRPOTrainer(load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path / metric, **extra)))
        trainer.backend = ScriptedBackend(texts)
        kept[metric] = trainer.collect(step=1)[1]["kept_groups"]
        assert trainer.backend.result.scores.tolist()[:4] == pytest.approx([1.0, 1.0, 0.9, 0.9])
    assert kept == {"acc": 0, "score": 4}


def test_soft_overlong_penalty_keeps_a_right_answer_at_the_limit_above_a_wrong_one(tiny_model_dir, tmp_path):
    """DAPO adds R_len to +-1 rewards; on [0, 1] scores its weight is 0.5. At weight 1 a right answer ending at
    L_max scored 0, as a short wrong one, and got the same negative advantage."""
    def texts(problem):  # right and 4 tokens = L_max with the stop token, wrong and short, wrong, right and short
        return [f"{problem.answer}".rjust(3, "0"), "x", "x", f"{problem.answer}"]

    extra = {"grpo.soft_overlong": "true", "env.max_new_tokens": "4", "grpo.overlong_cache": "1"}
    trainer = GRPOTrainer(load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **extra)))
    trainer.backend = ScriptedBackend(texts)
    batch, _ = trainer.collect(step=1)
    assert trainer.backend.result.response_mask[0].sum() == 4 and not trainer.backend.result.truncated[0]
    right = trainer.backend.result.scores[3].item()  # the task's weight on a right answer (0.9)
    assert batch.scores[:4].tolist() == pytest.approx([right - 0.5, 0.0, 0.0, right])
    assert batch.advantages[0] > 0 > batch.advantages[1]


def test_a_skipped_iteration_does_not_report_the_applied_ones_as_skipped(tiny_model_dir, tmp_path, monkeypatch):
    trainer = GRPOTrainer(load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{"run.steps": "1"})))
    trainer.backend = ScriptedBackend(lambda problem: [str(problem.answer), "1", "x", "9"])  # rewards that vary
    batch, _ = trainer.collect(step=1)
    micro_batches = math.ceil(batch.num_rows / trainer.config.loss.micro_batch_size)
    real_loss, calls = POLICY_LOSSES["ppo-clip"], []

    def second_iteration_overflows(*args, **kwargs):  # as float16 autocast's first steps can
        out = real_loss(*args, **kwargs)
        calls.append(1)
        if len(calls) > micro_batches:
            out.per_token_loss = out.per_token_loss * math.nan
        return out

    monkeypatch.setitem(POLICY_LOSSES, "ppo-clip", second_iteration_overflows)
    monkeypatch.setattr(trainer, "collect", lambda step: (batch, {"kept_groups": 1}))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    written = []
    stats = trainer.train_step(1, SimpleNamespace(write=written.append))
    assert stats["skipped_update"] == 0.0 and stats["skipped_iterations"] == 1
    assert any(not torch.equal(a, b) for a, b in zip(trainer.model.parameters(), before))
    assert written == ["step 1: 1 of 2 iterations skipped (non-finite loss or gradient); the others were applied"]


def test_entropy_is_logged_over_every_generated_token_not_only_the_loss_tokens(tiny_model_dir, tmp_path):
    extra = {"run.steps": "1", "grpo.overlong_filter": "true", "grpo.num_iterations": "1"}
    trainer = GRPOTrainer(load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **extra)))
    trainer.backend = ScriptedBackend(lambda problem: ["1234", "1", "12", "9"])  # row 0 is truncated (L_max 4)
    batch, _ = trainer.collect(step=1)
    assert batch.loss_mask[0].sum() == 0 and batch.attention_mask[0, batch.prompt_width :].sum() == 4
    _, entropy = trainer._logprobs(batch, slice(0, batch.num_rows))
    generated = batch.attention_mask[:, batch.prompt_width :].float()
    expected = ((entropy * generated).sum() / generated.sum()).item()
    loss_tokens_only = ((entropy * batch.loss_mask).sum() / batch.loss_mask.sum()).item()
    gap = abs(expected - loss_tokens_only)  # small: the untrained model is near uniform everywhere
    assert gap > 0 and abs(trainer.update(batch)["entropy"] - expected) < gap / 10


def test_k1_is_refused_as_the_kl_loss_term():
    with pytest.raises(ValueError, match=re.escape("grpo.kl_estimator: k1 has zero expected gradient as a loss term: use k3 "
                                                   "(DeepSeekMath, verl's low_var_kl) or k2 (its gradient is the KL's)")):
        load_config(GRPOConfig, overrides=["--grpo.kl_estimator", "k1"])
    assert load_config(GRPOConfig, overrides=["--grpo.kl_estimator", "k1", "--grpo.beta", "0"]).grpo.beta == 0  # no KL term


def test_resuming_a_checkpoint_whose_config_predates_a_key_is_refused_by_name(tiny_model_dir, tmp_path):
    """A DAPO run saved before grpo.overlong_penalty_factor existed trained with some weight the default no longer
    says: resuming it under today's default would change its rewards mid-run without a word. The resume names the
    keys its checkpoint's config lacks; once they hold what the run used, it continues."""
    import yaml

    dapo = overrides(tiny_model_dir, tmp_path, **{"run.steps": "1", "grpo.max_sampling_rounds": "1"})
    train(load_config(GRPOConfig, overrides=dapo, preset=DAPO_PRESET))
    stored = latest_checkpoint(tmp_path) / "config.yaml"
    saved = yaml.safe_load(stored.read_text())
    del saved["grpo"]["overlong_penalty_factor"], saved["grpo"]["dynamic_sampling_metric"]
    stored.write_text(yaml.safe_dump(saved))  # as an earlier version wrote it
    longer = {**dapo, "run.steps": "2"}
    with pytest.raises(ValueError, match=r"has no grpo.dynamic_sampling_metric, grpo.overlong_penalty_factor .*add the value"):
        GRPOTrainer(load_config(GRPOConfig, overrides=longer, preset=DAPO_PRESET), resume=True)
    saved["grpo"].update(overlong_penalty_factor=0.5, dynamic_sampling_metric="acc")  # what the run used
    stored.write_text(yaml.safe_dump(saved))
    assert GRPOTrainer(load_config(GRPOConfig, overrides=longer, preset=DAPO_PRESET), resume=True).start_step == 1


def test_the_rollout_training_mismatch_is_measured_and_corrected_by_the_trainers_ratio(tiny_model_dir, tmp_path):
    """The hf backend's log-probs are the trainer's up to rounding (mismatch ~0, "auto" corrects nothing). A top-p
    filter makes the sampler's distribution narrower than the trainer's: pi_train / pi_rollout < 1 on every token, and
    truncated importance sampling weights the loss by exactly that ratio (seq_mask by the row's product, or 0)."""
    def update_metrics(name, **extra):
        trainer = GRPOTrainer(load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path / name, **extra)))
        batch, _ = trainer.collect(1)
        assert batch.rollout_logp is not None and batch.rollout_logp.shape == batch.loss_mask.shape
        return trainer, batch, trainer.update(batch)

    trainer, _, metrics = update_metrics("plain", **{"grpo.num_iterations": "1"})
    assert trainer.rollout_correction == "none" and metrics["rollout_logp_abs_diff"] < 1e-5
    assert metrics["rollout_kl"] < 1e-9 and "rollout_is_weight_mean" not in metrics

    nucleus = {"rollout.top_p": "0.6", "grpo.num_iterations": "1", "loss.rollout_correction": "tis"}
    trainer, batch, metrics = update_metrics("tis", **nucleus)
    mask = batch.loss_mask.float()
    with torch.no_grad():
        train_logp = trainer._logprobs(batch, slice(0, batch.num_rows))[0]
    expected_weight = ((train_logp - batch.rollout_logp).exp() * mask).sum() / mask.sum()
    assert metrics["rollout_logp_abs_diff"] > 0.01 and metrics["rollout_kl"] > 0
    assert metrics["rollout_is_weight_mean"] == pytest.approx(expected_weight.item(), rel=1e-4)
    assert metrics["rollout_is_weight_mean"] < 1 and metrics["rollout_is_truncated_frac"] == 0.0

    _, _, metrics = update_metrics("seq_mask", **{**nucleus, "loss.rollout_correction": "seq_mask",
                                                  "loss.rollout_correction_cap": "1.05"})
    assert metrics["rollout_is_masked_frac"] > 0  # rows whose product of ratios fell below 1 / 1.05
