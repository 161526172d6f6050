"""rollout.max_staleness: batches drawn on a thread beside training (algos/run/rollout_pipeline.py). Step t's batch is
drawn by the weights of step t - 1 - k, whatever the threads' timing; runs are deterministic and resume bitwise."""

import copy
import re
import shutil
import time
from typing import ClassVar

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from algos.algorithms.dpo import DPOConfig
from algos.algorithms.grpo import GRPOConfig, GRPOTrainer, train
from algos.algorithms.ppo import PPOConfig, PPOTrainer
from algos.config import load_config
from algos.rollout import ROLLOUT_ENGINES, RolloutEngine
from algos.rollout.hf import HFRollout
from algos.run import loop
from algos.run.reporting import read_metrics, without_wall_times
from algos.run.rollout_pipeline import DrawnBatch, drawing_version, kept_in_flight, row_shares
from rlvr_env.testing import saved_tiny_model

TASK = '{"digits": 1, "terms": 2, "operators": "+", "prompt_template": "{expression}=", "format_weight": 0.0}'


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return saved_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden_size=32, num_layers=1, num_heads=2)


def overrides(model_dir, output_dir, **extra):
    """Four steps, a checkpoint after each; the entropy bonus moves the weights every step (an untrained model's
    rewards are all 0, so its advantages are)."""
    base = {
        "model.path": str(model_dir), "model.autocast": "null",
        "env.kwargs": TASK, "env.max_new_tokens": "4", "env.use_chat_template": "false", "env.eval_size": "4",
        "optim.lr": "1e-2", "loss.entropy_coef": "0.1", "run.output_dir": str(output_dir), "run.progress": "false",
        "run.tensorboard": "false", "run.plots": "false", "rollout.prompts_per_step": "2", "rollout.group_size": "2",
        "grpo.beta": "0", "grpo.overlong_cache": "2", "run.steps": "4", "run.save_every": "1", "run.keep_last": "4",
    }
    return {**base, **extra}


class FingerprintingRollout(HFRollout):
    """HFRollout that records, for every sampling call (not the greedy evaluations), the weights it drew from."""
    seen: ClassVar[list[list[float]]] = []  # shared by the run's backend and the actor's copy of it

    def generate(self, model, env, *, seeds=None, **sampling):
        if not sampling.get("greedy"):
            FingerprintingRollout.seen.append(fingerprint(model))
        return super().generate(model, env, seeds=seeds, **sampling)


def fingerprint(model) -> list[float]:
    return [float(param.detach().double().sum()) for param in model.parameters()]


def saved_fingerprint(directory) -> list[float]:
    return fingerprint(AutoModelForCausalLM.from_pretrained(directory))


def without_times(run_dir):
    return without_wall_times(read_metrics(run_dir))


def final_weights(run_dir):
    return load_file(run_dir / "checkpoint-4" / "model" / "model.safetensors")


def test_a_batch_is_shared_among_learners_in_whole_units_the_first_shares_the_larger():
    """Split mode's row_shares: 5 groups of 2 rows among 2 learners -> 3 groups and 2, every tensor and per-row list cut
    alike, a tuple looked into, an int kept; a learner left without a unit gets None."""
    rows = torch.arange(10)
    batch = ({"ids": rows.view(10, 1).repeat(1, 3), "texts": [str(i) for i in range(10)]}, rows.float(), 7)
    first, second = row_shares(batch, 2, 2)
    assert torch.equal(first[0]["ids"][:, 0], torch.arange(6)) and first[0]["texts"] == ["0", "1", "2", "3", "4", "5"]
    assert torch.equal(second[1], torch.arange(6, 10).float()) and second[2] == 7
    assert [share[1].tolist() for share in row_shares(batch, 3, 2)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert row_shares((rows[:2],), 2, 2)[1] is None and row_shares(None, 3, 2) == [None, None, None]
    with pytest.raises(ValueError, match="a batch of 10 rows does not split into whole units of 4 rows"):
        row_shares(batch, 2, 4)
    with pytest.raises(ValueError, match="a batch's list of 3 items is not one per row"):
        row_shares((rows, ["a", "b", "c"]), 2, 2)


def test_a_rollout_rank_sends_each_learner_its_share_of_the_steps_it_draws(monkeypatch):
    """RolloutServer (split mode, rollout rank 1 of 2, two learners, k = 1): it draws steps 2 and 4 whole, by the
    weights of steps 0 and 2 (received between them), and sends learner 0 the first two groups of 2 rows and learner 1
    the last two, each with the batch's version and metrics."""
    from types import SimpleNamespace

    from algos.run import rollout_pipeline as pipeline

    sent, weights_received = [], []
    monkeypatch.setattr(pipeline, "receive_object", lambda peer: {"start_step": 0, "first_to_draw": 1})
    monkeypatch.setattr(pipeline, "_receive_weights", lambda into, peer: weights_received.append(peer))
    monkeypatch.setattr(pipeline, "split_learners", lambda: 2)
    monkeypatch.setattr(pipeline, "send_object", lambda value, peer: sent.append((peer, value)))
    config = SimpleNamespace(rollout=SimpleNamespace(max_staleness=1), run=SimpleNamespace(steps=4),
                             distributed=SimpleNamespace(rollout_ranks=2))
    server = pipeline.RolloutServer(lambda step: (torch.arange(8) + 100 * step, {"reward": float(step)}),
                                    model=torch.nn.Linear(2, 2), config=config, rollout_rank=1, unit=2)
    server.serve()
    assert [(peer, drawn.step, drawn.version, drawn.batch.tolist(), drawn.metrics["reward"]) for peer, drawn in sent] == [
        (0, 2, 0, [200, 201, 202, 203], 2.0), (1, 2, 0, [204, 205, 206, 207], 2.0),
        (0, 4, 2, [400, 401, 402, 403], 4.0), (1, 4, 2, [404, 405, 406, 407], 4.0)]
    assert weights_received == [0, 0]  # the start's weights, then step 2's for step 4, from the first learner


def test_a_learner_resumes_its_own_share_of_the_batches_in_flight_and_drops_them_on_another_count():
    saved = {"max_staleness": 1, "learners": 2,
             "batches": [DrawnBatch(3, 1, [torch.zeros(2), torch.ones(2)], {"reward": 0.5})]}
    kept, dropped = kept_in_flight(saved, 1, torch.device("cpu"), learner=1, learners=2)
    assert dropped == 0 and torch.equal(kept[3].batch, torch.ones(2)) and kept[3].version == 1
    assert kept_in_flight(saved, 1, torch.device("cpu"), learner=0, learners=3) == ({}, 1)  # another number of learners
    colocated = {"max_staleness": 1, "batches": [DrawnBatch(3, 1, torch.ones(2), {})]}  # no shares: one learner's
    assert torch.equal(kept_in_flight(colocated, 1, torch.device("cpu"))[0][3].batch, torch.ones(2))


def test_the_drawing_weights_are_k_steps_behind_and_never_before_the_start():
    assert [drawing_version(step, 0, 0) for step in range(1, 5)] == [0, 1, 2, 3]
    assert [drawing_version(step, 1, 0) for step in range(1, 5)] == [0, 0, 1, 2]
    assert [drawing_version(step, 2, 0) for step in range(1, 6)] == [0, 0, 0, 1, 2]
    assert [drawing_version(step, 1, 3) for step in range(4, 7)] == [3, 3, 4]  # resumed after step 3


@pytest.mark.parametrize("staleness", [1, 2])
def test_each_steps_batch_is_drawn_by_the_weights_of_step_t_minus_1_minus_k(tiny_model_dir, tmp_path, staleness):
    """Every sampling call sees the exact weights drawing_version names: the initial ones, then checkpoint-v's."""
    FingerprintingRollout.seen.clear()
    config = load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{
        "rollout.max_staleness": str(staleness)}))
    GRPOTrainer(config, backend=FingerprintingRollout()).train()
    versions = {0: saved_fingerprint(tiny_model_dir)}
    versions.update({v: saved_fingerprint(tmp_path / f"checkpoint-{v}" / "model") for v in range(1, 4)})
    assert versions[1] != versions[0] and versions[2] != versions[1]  # the weights move every step
    want = [versions[drawing_version(step, staleness, 0)] for step in range(1, 5)]
    assert FingerprintingRollout.seen == want
    records = [r for r in read_metrics(tmp_path) if "async/staleness" in r]
    assert [r["async/staleness"] for r in records] == [min(step - 1, staleness) for step in range(1, 5)]
    assert all(r["async/dropped_batches"] == 0 and r["async/learner_wait_s"] >= 0 for r in records)
    assert "rollout_is_weight_mean" in records[-1]  # "auto" corrects stale samples (tis)


def algorithm_run(algorithm: str, model_dir, output_dir, **extra):
    """(trainer class, config) of this module's small run for ``algorithm`` ("grpo", "ppo" or "online_dpo"), ``extra``
    over it."""
    from algos.algorithms import dpo

    base = overrides(model_dir, output_dir, **extra)
    if algorithm == "grpo":
        return GRPOTrainer, load_config(GRPOConfig, overrides=base)
    shared = {key: value for key, value in base.items() if not key.startswith("grpo.")}
    if algorithm == "ppo":
        return PPOTrainer, load_config(PPOConfig, overrides=shared)
    return dpo.DPOTrainer, load_config(DPOConfig, preset=dpo.PRESETS["online"], overrides={**shared, "dpo.dataset": "null"})


@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "online_dpo"])
def test_each_algorithms_collect_samples_from_the_policy_it_is_handed(algorithm, tiny_model_dir, tmp_path):
    """The actor calls the algorithm's collect(step, policy=, backend=) with its copy of the drawing version's weights
    while the learner updates its own: every sampling call of that step gets the copy (without a copy, the run's
    policy). A collect that sampled from the live policy passed a k = 1 run's fingerprints, by timing alone."""

    class Recording(HFRollout):
        models: ClassVar[list] = []

        def generate(self, model, env, **kwargs):
            Recording.models.append(model)
            return super().generate(model, env, **kwargs)

    trainer_class, config = algorithm_run(algorithm, tiny_model_dir, tmp_path)
    trainer = trainer_class(config)
    collect = trainer.rollouts.collect  # what the pipeline calls: GRPO's collect, PPO's draw, online DPO's online_batch
    snapshot = copy.deepcopy(trainer.run.model)
    collect(1, policy=snapshot, backend=Recording())
    handed = len(Recording.models)
    collect(2, backend=Recording())
    assert handed >= 1 and all(model is snapshot for model in Recording.models[:handed])
    assert Recording.models[handed:] and all(model is trainer.run.model for model in Recording.models[handed:])


def test_a_synchronous_run_logs_no_async_metrics_and_draws_with_the_current_weights(tiny_model_dir, tmp_path):
    """Each step's batch drawn by the weights it trains, when it asks, and the time that took logged (time/rollout_s)."""
    FingerprintingRollout.seen.clear()
    GRPOTrainer(load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path)),
                backend=FingerprintingRollout()).train()
    want = [saved_fingerprint(tiny_model_dir)] + [saved_fingerprint(tmp_path / f"checkpoint-{v}" / "model")
                                                  for v in range(1, 4)]
    assert FingerprintingRollout.seen == want
    assert not any(key.startswith("async/") for record in read_metrics(tmp_path) for key in record)
    for record in read_metrics(tmp_path)[1:]:  # each step drew its own batch: that took a part of the step
        assert 0 < record["time/rollout_s"] < record["step_time_s"] and 0 < record["time/update_s"]
        assert record["time/rollout_s"] + record["time/update_s"] <= record["step_time_s"]


def test_an_overlapped_run_is_deterministic_and_a_resume_from_its_checkpoint_is_bitwise(tiny_model_dir, tmp_path):
    """Two k = 1 runs end on the same weights; the first, cut back to checkpoint-2 (which keeps batch 3, drawn by step 1's
    weights) resumes to them bitwise, with the same metrics."""
    config = overrides(tiny_model_dir, tmp_path / "first", **{"rollout.max_staleness": "1"})
    train(load_config(GRPOConfig, overrides=config))
    train(load_config(GRPOConfig, overrides={**config, "run.output_dir": str(tmp_path / "second")}))
    want = final_weights(tmp_path / "first")
    assert all(torch.equal(want[key], value) for key, value in final_weights(tmp_path / "second").items())
    assert without_times(tmp_path / "second") == without_times(tmp_path / "first")

    for step in (3, 4):  # as if killed after checkpoint-2
        shutil.rmtree(tmp_path / "first" / f"checkpoint-{step}")
    train(load_config(GRPOConfig, overrides=config), resume=True)
    assert all(torch.equal(want[key], value) for key, value in final_weights(tmp_path / "first").items())
    assert without_times(tmp_path / "first") == without_times(tmp_path / "second")


@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "online_dpo"])
def test_a_resumed_k1_run_trains_its_checkpoints_batch_and_draws_only_the_steps_after(algorithm, tiny_model_dir, tmp_path):
    """Each algorithm's checkpoint-2 of a k = 1 run holds batch 3 (drawn by step 1's weights): resumed, the run samples
    step 4 alone, by checkpoint-2's weights. A checkpoint without its batches drawn ahead would draw batch 3 again, by
    newer weights: the same tokens often enough on a tiny model that the final weights alone cannot tell."""
    trainer_class, config = algorithm_run(algorithm, tiny_model_dir, tmp_path, **{"rollout.max_staleness": "1"})
    trainer_class(config, backend=FingerprintingRollout()).train()  # a run leaves the config it is given as it was
    for step in (3, 4):
        shutil.rmtree(tmp_path / f"checkpoint-{step}")
    FingerprintingRollout.seen.clear()
    trainer_class(config, resume=True, backend=FingerprintingRollout()).train()
    assert FingerprintingRollout.seen == [saved_fingerprint(tmp_path / "checkpoint-2" / "model")]


def test_a_resume_under_another_staleness_drops_the_batches_in_flight_and_counts_them(tiny_model_dir, tmp_path,
                                                                                         caplog):
    config = overrides(tiny_model_dir, tmp_path, **{"rollout.max_staleness": "1"})
    train(load_config(GRPOConfig, overrides=config))
    for step in (3, 4):
        shutil.rmtree(tmp_path / f"checkpoint-{step}")
    with caplog.at_level("WARNING", logger="rlvr"):
        train(load_config(GRPOConfig, overrides={**config, "rollout.max_staleness": "2"}), resume=True)
    assert "1 batches in flight were drawn under 1; dropped" in caplog.text
    resumed = {r["step"]: r for r in read_metrics(tmp_path) if "async/staleness" in r and r["step"] >= 3}
    assert resumed[3]["async/dropped_batches"] == 1  # batch 3, drawn under k = 1
    assert resumed[3]["async/staleness"] == 0 and resumed[4]["async/staleness"] == 1  # drawn from checkpoint-2 on


@pytest.fixture
def no_overlap_engine():
    """A registered rollout engine that cannot sample beside training (samples_while_training left False)."""
    ROLLOUT_ENGINES.register("no-overlap", RolloutEngine(lambda config, sampling, multiturn: HFRollout(**sampling)))
    yield "no-overlap"
    del ROLLOUT_ENGINES["no-overlap"]


def test_bad_staleness_settings_are_refused_by_key(tiny_model_dir, tmp_path, monkeypatch, no_overlap_engine):
    with pytest.raises(ValueError, match=r"rollout.max_staleness.* must be >= 0"):
        load_config(GRPOConfig, overrides={"rollout.max_staleness": "-1"}).validate()
    with pytest.raises(ValueError, match=re.escape(
            "config rollout.max_staleness: draws batches ahead, and offline DPO samples none (its pairs are "
            "dpo.dataset's): set it to 0, or dpo.online = true") + "$"):
        load_config(DPOConfig, overrides={"rollout.max_staleness": "1", "dpo.dataset": "pairs.jsonl"}).validate()
    config = load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{
        "rollout.max_staleness": "1", "rollout.backend": no_overlap_engine}))
    with pytest.raises(ValueError, match=r"max_staleness.*'no-overlap' cannot: use 'hf', 'static', 'vllm', split mode"):
        GRPOTrainer(config)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # refused before the run directory is made
    with monkeypatch.context() as split:  # split mode: the engine samples in a rollout rank's own process
        split.setattr(loop, "split_mode", lambda: True)
        loop.check_overlap(config, 1, custom_backend=False)


def test_overlap_under_torchrun_needs_split_mode_and_a_passed_in_backend_is_taken_to_sample_beside_training(
        no_overlap_engine):
    config = load_config(GRPOConfig, overrides={"rollout.max_staleness": "2", "rollout.backend": "hf"})
    with pytest.raises(ValueError, match=r"^config rollout.max_staleness: = 2 overlaps in one process, or in split mode "
                                         r"\(distributed.rollout_ranks\), and torchrun started 2 processes that each "
                                         r"sample and learn: set distributed.rollout_ranks, or this to 0$"):
        loop.check_overlap(config, 2, custom_backend=False)
    config.distributed.rollout_ranks = 1
    loop.check_overlap(config, 2, custom_backend=False)  # split mode: ranks that sample, ranks that learn
    config = load_config(GRPOConfig, overrides={"rollout.max_staleness": "1", "rollout.backend": no_overlap_engine})
    with pytest.raises(ValueError, match=r"^config rollout.max_staleness: = 1 samples on a thread beside training, "
                                         r"which rollout.backend = 'no-overlap' cannot: use 'hf', 'static', 'vllm', "
                                         r"split mode \(torchrun with distributed.rollout_ranks, where every engine "
                                         r"samples in a process of its own\), or set it to 0$"):
        loop.check_overlap(config, 1, custom_backend=False)
    loop.check_overlap(config, 1, custom_backend=True)  # a backend passed in (a ScriptedRollout) is taken to
    config.rollout.max_staleness = 0
    loop.check_overlap(config, 2, custom_backend=False)  # the synchronous run needs nothing of either


def test_the_static_engine_draws_beside_training_what_the_hf_engine_draws(tiny_model_dir, tmp_path):
    """The static engine (the GPU's default; eager decode steps on a CPU) on the actor's copy: the same run as hf's."""
    config = overrides(tiny_model_dir, tmp_path / "hf", **{"rollout.max_staleness": "1", "rollout.backend": "hf"})
    train(load_config(GRPOConfig, overrides=config))
    train(load_config(GRPOConfig, overrides={**config, "rollout.backend": "static",
                                             "run.output_dir": str(tmp_path / "static")}))
    hf, static = final_weights(tmp_path / "hf"), final_weights(tmp_path / "static")
    assert all(torch.allclose(hf[key], static[key], atol=1e-5) for key in hf)
    assert [r.get("async/staleness") for r in read_metrics(tmp_path / "static")][1:] == [0.0, 1.0, 1.0, 1.0]


def test_ppo_draws_ahead_and_its_learner_values_the_rows_at_training_time_and_resumes_bitwise(tiny_model_dir, tmp_path):
    """PPO under k = 1: step t's rows sampled by step t - 2's weights, their old log-probs, values and GAE the
    learner's at training time (PPOTrainer.prepare); cut back to checkpoint-2, the run resumes to the same weights."""
    FingerprintingRollout.seen.clear()
    config = {
        "model.path": str(tiny_model_dir), "model.autocast": "null", "env.kwargs": TASK, "env.max_new_tokens": "4",
        "env.use_chat_template": "false", "env.eval_size": "4", "optim.lr": "1e-2", "run.output_dir": str(tmp_path),
        "run.progress": "false", "run.tensorboard": "false", "run.plots": "false", "rollout.prompts_per_step": "2",
        "rollout.group_size": "2", "run.steps": "4", "run.save_every": "1", "run.keep_last": "4",
        "rollout.max_staleness": "1", "ppo.critic_warmup_steps": "0", "loss.entropy_coef": "0.1"}  # the policy moves
    PPOTrainer(load_config(PPOConfig, overrides=config), backend=FingerprintingRollout()).train()
    versions = [saved_fingerprint(tiny_model_dir)] + [saved_fingerprint(tmp_path / f"checkpoint-{v}" / "model")
                                                      for v in range(1, 4)]
    assert versions[1] != versions[0]
    assert FingerprintingRollout.seen == [versions[drawing_version(step, 1, 0)] for step in range(1, 5)]
    want = final_weights(tmp_path)
    first_metrics = without_times(tmp_path)
    for step in (3, 4):
        shutil.rmtree(tmp_path / f"checkpoint-{step}")
    PPOTrainer(load_config(PPOConfig, overrides=config), resume=True, backend=FingerprintingRollout()).train()
    assert all(torch.equal(want[key], value) for key, value in final_weights(tmp_path).items())
    assert without_times(tmp_path) == first_metrics


def test_a_finished_run_leaves_nothing_drawn_or_staged_and_its_waits_are_within_the_run(tiny_model_dir, tmp_path,
                                                                                         caplog):
    """Every staged version was drawn with and every drawn batch trained on; the waits are parts of the run's time,
    and the learner's wait and its own work (time/update_s) parts of each step's; a CPU run says the actor and the
    learner share its cores."""
    trainer = GRPOTrainer(load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{
        "rollout.max_staleness": "1"})))
    started = time.perf_counter()
    with caplog.at_level("WARNING", logger="rlvr"):
        trainer.train()
    elapsed = time.perf_counter() - started
    assert trainer.rollouts._drawn == {} and trainer.rollouts._staged == {}
    assert not trainer.rollouts._thread.is_alive() and trainer.rollouts._thread.daemon
    assert trainer.rollouts.backend is not trainer.backend  # the actor samples with its own engine
    for record in read_metrics(tmp_path)[1:]:
        assert 0 <= record["async/learner_wait_s"] <= elapsed and 0 <= record["async/engine_wait_s"] <= elapsed
        assert 0 < record["async/draw_s"] <= elapsed
        # the step's own work is what it did not spend waiting for its batch (the actor drew it: no time/rollout_s)
        assert "time/rollout_s" not in record and 0 < record["time/update_s"]
        assert record["async/learner_wait_s"] + record["time/update_s"] <= record["step_time_s"]
    assert "on a CPU: the actor and the learner share" in caplog.text


def test_a_run_that_fails_in_its_learner_stops_its_actor(tiny_model_dir, tmp_path):
    """run_training closes the agent's rollouts however the run ends: a learner's error at step 2 leaves no actor
    waiting for weights that never come."""
    trainer = GRPOTrainer(load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{
        "rollout.max_staleness": "1", "run.steps": "3"})))
    update, updates = trainer.update, []

    def update_once_then_fail(batch):
        updates.append(batch)
        if len(updates) == 2:
            raise FloatingPointError("the learner broke")
        return update(batch)
    trainer.update = update_once_then_fail
    with pytest.raises(FloatingPointError, match="the learner broke"):
        trainer.train()
    assert not trainer.rollouts._thread.is_alive()


def test_close_stops_an_actor_waiting_for_weights_and_an_actors_failure_is_raised_by_the_learner(tiny_model_dir,
                                                                                                 tmp_path):
    quiet = type("Quiet", (), {"write": lambda self, line: None})()
    config = load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path, **{"rollout.max_staleness": "1"}))
    trainer = GRPOTrainer(config)
    trainer.train_step(1, quiet)  # the actor then draws batch 3 and waits for step 2's weights, which never come
    trainer.rollouts.close()
    assert not trainer.rollouts._thread.is_alive() and trainer.rollouts._failure is None

    class Failing(HFRollout):
        def generate(self, model, env, *, seeds=None, **sampling):
            raise OSError("the engine broke")

    failing = GRPOTrainer(load_config(GRPOConfig, overrides=overrides(tiny_model_dir, tmp_path / "failing", **{
        "rollout.max_staleness": "1"})), backend=Failing())
    with pytest.raises(RuntimeError, match=r"the rollout thread \(rollout.max_staleness\) failed") as raised:
        failing.rollouts.batch_for(1)
    assert isinstance(raised.value.__cause__, OSError)
