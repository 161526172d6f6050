"""Split mode (distributed.rollout_ranks): under torchrun, the last rank only draws the batches, the others only learn
and the first learner sends it the weights each batch is drawn by. The batches are those one process draws, so a split
run ends on the weights of the one-process run: colocated k = 1 equals split k = 1, and split k = 0 the synchronous
run, bitwise with one learner; two learners (DDP, FSDP2) train on their shares of each batch as one process does."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_rollout_pipeline import final_weights, overrides  # the colocated tests' run, which split mode repeats

from algos.algorithms.grpo import GRPOConfig, train
from algos.config import DistributedConfig, load_config
from algos.run.reporting import COMPLETIONS_FILE, read_metrics, without_wall_times
from algos.system.distributed import World, init_distributed
from rlvr_env.testing import biased_addition_model, saved_tiny_model

ROOT = Path(__file__).resolve().parents[1]
RLVR = str(Path(sys.executable).with_name("rlvr"))


@pytest.fixture(autouse=True)
def one_thread_like_the_ranks():
    """The ranks run with one thread each (OMP_NUM_THREADS=1, below); the one-process runs they must equal bitwise run
    with one too, also when pytest is started without `make test`'s OMP_NUM_THREADS=1 (a matmul's sums are split
    by thread count)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return saved_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden_size=32, num_layers=1, num_heads=2)


def split_run(settings: dict[str, str], *extra: str, processes: int = 2, algo: str = "grpo") -> None:
    """`rlvr train --algo ALGO` under torchrun: ``processes`` processes, the last of them a rollout rank."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", "--no-python",
               RLVR, "train", "--algo", algo, *[f"--{key}={value}" for key, value in settings.items()],
               "--distributed.rollout_ranks=1", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]


def cut_and_resumed_weights(settings: dict[str, str], processes: int = 2) -> dict[str, torch.Tensor]:
    """The split run of ``settings`` cut back to checkpoint-2 (which keeps batch 3 in flight), resumed: its final
    weights."""
    for step in (3, 4):
        shutil.rmtree(Path(settings["run.output_dir"]) / f"checkpoint-{step}")
    split_run(settings, "--resume", processes=processes)
    return final_weights(Path(settings["run.output_dir"]))


def without_times(run_dir: Path) -> list[dict]:
    drop = ("world_size", "distributed_strategy")
    return [{key: value for key, value in record.items() if key not in drop}
            for record in without_wall_times(read_metrics(run_dir))]


def assert_metrics_match(records: list[dict], others: list[dict], ignore: tuple[str, ...] = (), **tolerance) -> None:
    """Two runs' metrics (without_times) agree step by step: the same keys, and each value but those of keys ending in
    an ``ignore`` suffix equal to the other's within ``tolerance`` (pytest.approx's rel and abs)."""
    assert [record.keys() for record in records] == [record.keys() for record in others]
    for record, other in zip(records, others):
        for key, value in record.items():
            if not key.endswith(ignore):
                assert value == pytest.approx(other[key], **tolerance), (record["step"], key)


def test_a_split_k1_run_ends_on_the_colocated_runs_weights_and_resumes_bitwise(tiny_model_dir, tmp_path):
    """Batch t drawn on rank 1 by step t - 2's weights, sent there by rank 0: the colocated k = 1 run's batches, hence
    its weights and metrics. Cut back to checkpoint-2 (which keeps batch 3), it resumes to them."""
    settings = overrides(tiny_model_dir, tmp_path / "split", **{"rollout.max_staleness": "1"})
    split_run(settings)
    train(load_config(GRPOConfig, overrides={**settings, "run.output_dir": str(tmp_path / "colocated")}))
    want = final_weights(tmp_path / "colocated")
    assert all(torch.equal(want[key], value) for key, value in final_weights(tmp_path / "split").items())
    # The metrics to a float's last bits: under torch's AVX2 kernels one logged mean (rollout_logp_abs_diff, a float32
    # sum) came out 2 ulp apart between the processes while the weights stayed bitwise equal.
    assert_metrics_match(without_times(tmp_path / "split"), without_times(tmp_path / "colocated"), rel=1e-6, abs=1e-12)
    staleness = [record["async/staleness"] for record in read_metrics(tmp_path / "split") if "async/staleness" in record]
    assert staleness == [0, 1, 1, 1]

    assert all(torch.equal(want[key], value) for key, value in cut_and_resumed_weights(settings).items())


def test_a_split_k0_run_ends_on_the_synchronous_runs_weights(tiny_model_dir, tmp_path):
    """k = 0 in split mode: rank 1 draws batch t by step t - 1's weights, as the one-process run draws it."""
    settings = overrides(tiny_model_dir, tmp_path / "split")
    split_run(settings)
    train(load_config(GRPOConfig, overrides={**settings, "run.output_dir": str(tmp_path / "one")}))
    want = final_weights(tmp_path / "one")
    assert all(torch.equal(want[key], value) for key, value in final_weights(tmp_path / "split").items())
    # the rollout rank writes what the model wrote (run.log_completions), as the one process does
    written = read_metrics(tmp_path / "one", COMPLETIONS_FILE)
    assert written and read_metrics(tmp_path / "split", COMPLETIONS_FILE) == written


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_learners_train_on_their_shares_as_one_process_trains_and_resume_bitwise(strategy, tiny_model_dir, tmp_path):
    """3 processes: ranks 0 and 1 learn (DDP or FSDP2 between them), rank 2 draws each step whole and sends each
    learner its prompts' groups. The one-process k = 1 run's batches, so its weights to float rounding (the order of
    the learners' reduction) and its metrics; cut back to checkpoint-2 (both learners' shares of batch 3 in it), it
    resumes to the same weights bitwise."""
    settings = overrides(tiny_model_dir, tmp_path / "split", **{"rollout.max_staleness": "1",
                                                                 "distributed.strategy": strategy})
    split_run(settings, processes=3)
    train(load_config(GRPOConfig, overrides={**settings, "run.output_dir": str(tmp_path / "one")}))
    want, got = final_weights(tmp_path / "one"), final_weights(tmp_path / "split")
    assert max((want[key] - got[key]).abs().max().item() for key in want) < 1e-5
    start = load_file(tiny_model_dir / "model.safetensors")
    assert max((want[key] - start[key]).abs().max().item() for key in want) > 1e-3  # not untrained copies
    assert_metrics_match(without_times(tmp_path / "split"), without_times(tmp_path / "one"), abs=1e-5)

    assert all(torch.equal(got[key], value) for key, value in cut_and_resumed_weights(settings, processes=3).items())


@pytest.mark.parametrize("algo", ["ppo", "online_dpo"])
def test_ppo_and_online_dpo_on_two_learners_train_as_one_process_trains(algo, tmp_path):
    """PPO (its critic's values and GAE computed by each learner on its share at training time) and online DPO (a
    learner's share is whole pairs, or none) in split mode: 2 learners (DDP) and 1 rollout rank at k = 1 end on the
    one-process run's weights to float rounding. The model samples right and wrong sums, so PPO's rewards differ and
    online DPO draws pairs."""
    from algos.algorithms import dpo, ppo

    model = biased_addition_model(tmp_path / "model", steps=60)
    settings = {key: value for key, value in overrides(model, tmp_path / "split", **{
        "rollout.max_staleness": "1", "rollout.prompts_per_step": "4", "rollout.group_size": "4"}).items()
        if not key.startswith("grpo.")}
    # Adam's first step is ~lr * sign(g): a gradient component that cancels to ~0 would turn the learners' float
    # rounding into a whole step, which a larger eps keeps to rounding's size; and at lr 1e-2 PPO's 8 Adam steps per
    # step amplify rounding ~10x a step (1e-7 after step 1, 1.5e-4 after step 4), so a tenth of it
    settings.update({"optim.adam_eps": "1e-4", "optim.lr": "1e-3"})
    if algo == "ppo":
        settings["ppo.critic_warmup_steps"] = "0"
    split_run(settings, processes=3, algo=algo)
    one = {**settings, "run.output_dir": str(tmp_path / "one")}
    if algo == "ppo":
        ppo.train(load_config(ppo.PPOConfig, overrides=one))
    else:
        dpo.train(load_config(dpo.DPOConfig, overrides=one, preset=dpo.PRESETS["online"]))
    want, got = final_weights(tmp_path / "one"), final_weights(tmp_path / "split")
    assert max((want[key] - got[key]).abs().max().item() for key in want) < 1e-4  # test_distributed's 1 vs 2 ranks
    start = load_file(model / "model.safetensors")
    assert max((want[key] - start[key]).abs().max().item() for key in want) > 1e-3  # not untrained copies
    split = without_times(tmp_path / "split")
    # a clipped share counts tokens, and one on the clip's edge flips with rounding (PPO's value_clip_frac: 1 of 256)
    assert_metrics_match(split, without_times(tmp_path / "one"), ignore=("clip_frac",), abs=1e-4)
    if algo == "online_dpo":  # a step of one pair: one learner had none and joined the other's update (DDP) all the same
        assert 1 in [record["dpo/pairs"] for record in split if "dpo/pairs" in record]


@pytest.mark.parametrize("world", [World(0, 2), World(0, 1, rollout_rank=0)], ids=["learner", "rollout-rank"])
def test_prompts_that_do_not_share_among_the_learners_are_refused_on_every_rank(world, tiny_model_dir, tmp_path,
                                                                               monkeypatch):
    """3 prompts for split mode's 2 learners: a learner refuses by key, and a rollout rank (a world of its own) refuses
    alike rather than waiting for learners that left."""
    from algos.algorithms.grpo import GRPOTrainer
    from algos.run import loop

    monkeypatch.setattr(loop, "init_distributed", lambda *args: world)
    monkeypatch.setattr(loop, "split_mode", lambda: True)
    monkeypatch.setattr(loop, "split_learners", lambda: 2)
    settings = overrides(tiny_model_dir, tmp_path / "run", **{"rollout.prompts_per_step": "3",
                                                                "distributed.rollout_ranks": "1"})
    with pytest.raises(ValueError, match=r"config rollout.prompts_per_step: 3 prompts do not split across 2 learner "
                                         r"processes \(torchrun's less distributed.rollout_ranks\): make it a multiple of 2"):
        GRPOTrainer(load_config(GRPOConfig, overrides=settings))


def test_a_split_without_a_learner_is_refused_by_key(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="config distributed.rollout_ranks: = 2 leaves no learner among torchrun's 2 "
                                         "processes: at most 1"):
        init_distributed(DistributedConfig(rollout_ranks=2), "cpu")
    with pytest.raises(ValueError, match="distributed.rollout_ranks: must be >= 0"):
        DistributedConfig(rollout_ranks=-1).validate()


def test_a_rollout_rank_keeps_no_reference_and_writes_nothing(tiny_model_dir, tmp_path, monkeypatch):
    """A rollout rank's trainer (as torchrun's last rank sets it up) samples with the policy and keeps no KL reference,
    which only the learners use, and opens no run directory."""
    from algos.algorithms.grpo import GRPOTrainer
    from algos.run import loop
    from algos.run.rollout_pipeline import RolloutServer

    monkeypatch.setattr(loop, "init_distributed", lambda *args: World(0, 1, rollout_rank=0))
    settings = overrides(tiny_model_dir, tmp_path / "run", **{"grpo.beta": "0.04", "distributed.rollout_ranks": "1"})
    trainer = GRPOTrainer(load_config(GRPOConfig, overrides=settings))
    assert trainer.ref_model is None and isinstance(trainer.rollouts, RolloutServer)
    assert not (tmp_path / "run").exists()
