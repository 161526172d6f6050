"""Split mode (distributed.rollout_ranks): under torchrun, rank 1 only draws the batches, rank 0 only learns and
sends it the weights each batch is drawn by. The batches are those one process draws, so a split run ends on the
weights of the one-process run: colocated k = 1 equals split k = 1, and split k = 0 the synchronous run, bitwise."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_rollout_pipeline import TIMES, final_weights, overrides  # the colocated tests' run, which split mode repeats

from algos.algorithms.grpo import GRPOConfig, train
from algos.config import DistributedConfig, load_config
from algos.run.reporting import read_metrics
from algos.system.distributed import init_distributed
from rlvr_env.testing import build_char_tokenizer, build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
RLVR = str(Path(sys.executable).with_name("rlvr"))


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "model"
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def split_run(settings: dict[str, str], *extra: str) -> None:
    """`rlvr train --algo grpo` under torchrun: 2 processes, one of them a rollout rank."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--no-python",
               RLVR, "train", "--algo", "grpo", *[f"--{key}={value}" for key, value in settings.items()],
               "--distributed.rollout_ranks=1", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]


def without_times(run_dir: Path) -> list[dict]:
    drop = (*TIMES, "world_size", "distributed_strategy")
    return [{key: value for key, value in record.items() if key not in drop} for record in read_metrics(run_dir)]


def test_a_split_k1_run_ends_on_the_colocated_runs_weights_and_resumes_bitwise(tiny_model_dir, tmp_path):
    """Batch t drawn on rank 1 by step t - 2's weights, sent there by rank 0: the colocated k = 1 run's batches, hence
    its weights and metrics. Cut back to checkpoint-2 (which keeps batch 3), it resumes to them."""
    settings = overrides(tiny_model_dir, tmp_path / "split", **{"rollout.max_staleness": "1"})
    split_run(settings)
    train(load_config(GRPOConfig, overrides={**settings, "run.output_dir": str(tmp_path / "colocated")}))
    want = final_weights(tmp_path / "colocated")
    assert all(torch.equal(want[key], value) for key, value in final_weights(tmp_path / "split").items())
    assert without_times(tmp_path / "split") == without_times(tmp_path / "colocated")
    staleness = [record["async/staleness"] for record in read_metrics(tmp_path / "split") if "async/staleness" in record]
    assert staleness == [0, 1, 1, 1]

    for step in (3, 4):
        shutil.rmtree(tmp_path / "split" / f"checkpoint-{step}")
    split_run(settings, "--resume")
    assert all(torch.equal(want[key], value) for key, value in final_weights(tmp_path / "split").items())


def test_a_split_k0_run_ends_on_the_synchronous_runs_weights(tiny_model_dir, tmp_path):
    """k = 0 in split mode: rank 1 draws batch t by step t - 1's weights, as the one-process run draws it."""
    settings = overrides(tiny_model_dir, tmp_path / "split")
    split_run(settings)
    train(load_config(GRPOConfig, overrides={**settings, "run.output_dir": str(tmp_path / "one")}))
    want = final_weights(tmp_path / "one")
    assert all(torch.equal(want[key], value) for key, value in final_weights(tmp_path / "split").items())


@pytest.mark.parametrize(("processes", "rollout_ranks", "message"), [
    ("2", 2, "= 2 leaves no learner among torchrun's 2 processes: at most 1"),
    ("3", 1, "split mode trains on one learner rank for now: set it to 2"),
])
def test_a_split_without_a_learner_or_with_several_is_refused_by_key(monkeypatch, processes, rollout_ranks, message):
    monkeypatch.setenv("WORLD_SIZE", processes)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match=f"config distributed.rollout_ranks: {message}"):
        init_distributed(DistributedConfig(rollout_ranks=rollout_ranks), "cpu")
    with pytest.raises(ValueError, match="distributed.rollout_ranks: must be >= 0"):
        DistributedConfig(rollout_ranks=-1).validate()
