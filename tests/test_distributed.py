"""Data parallelism under torchrun (2 ranks, gloo, CPU): the same config trains the same weights as one process.

Each 2-rank run goes through tests/distributed_worker.py (`rlvr train` in-process, plus a check after every step
that all ranks hold identical weights) or the `rlvr` command itself; each has a timeout, since a hang is how
collectives that do not match fail. Weights are compared through the per-step summaries the worker records.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from algos.config import load_file as load_config_file
from algos.system import distributed
from algos.system.distributed import World
from algos.system.paths import latest_checkpoint, list_checkpoints

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "distributed_worker.py"
RUN_TIMEOUT_S = 240
TASK_KWARGS = '{"digits": 1, "terms": 2, "operators": "+", "prompt_template": "{expression}=", "format_weight": 0.0}'
# The weight sums move ~0.4-1% of their scale in these runs; one process and two ranks agree to float rounding.
TOLERANCE = 1e-4


def test_one_process_is_a_world_of_one_where_every_collective_is_the_identity():
    """What the trainers call on every rank is a no-op without torchrun, so one code path serves both."""
    assert distributed.current_world() == World() and World().is_main
    assert World(rank=1, size=4).span(8) == range(2, 4) and World().span(8) == range(8)
    rows = torch.arange(5.0)
    assert distributed.gather_rows(rows) is rows and distributed.gather_objects({"a": 1}) == [{"a": 1}]
    assert distributed.sum_over_ranks(2, 3.5) == [2.0, 3.5] and distributed.max_over_ranks(7) == [7.0]
    assert distributed.rank_offset(6) == 0 and distributed.broadcast_from_main("x") == "x"
    micro = [slice(0, 2), slice(2, 3)]
    assert distributed.padded_micro_batches(micro) == micro
    assert distributed.gather_padded(rows[None], rows[None])[1] == 0
    with pytest.raises(KeyError, match="refused"):
        distributed.run_on_main(lambda: {}["refused"])
    assert distributed.run_on_main(lambda: 5) == 5
    forward = distributed.TrainingForward(policy=torch.nn.Linear(2, 2))
    assert distributed.wrap(forward, World(), "fsdp2", torch.device("cpu")) is forward
    with distributed.whole_weights(forward), distributed.gradient_sync(forward, enabled=False):
        assert forward(lambda x: x + 1, 1) == 2


def test_a_rank_is_placed_on_its_own_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    rank_3 = World(rank=3, size=4, local_rank=3, local_size=4)
    assert distributed.device_for(rank_3, "auto") == "cuda:3" and distributed.device_for(rank_3, "cuda") == "cuda:3"
    assert distributed.device_for(World(), "auto") == "auto" and distributed.device_for(rank_3, "cpu") == "cpu"
    with pytest.raises(ValueError, match=r"model.device = 'cuda:0' puts every rank on one GPU"):
        distributed.device_for(rank_3, "cuda:0")


def test_fsdp2_shards_the_decoder_layers_transformers_names():
    from rlvr_env.testing import build_char_tokenizer, build_tiny_model

    model = build_tiny_model(build_char_tokenizer(), hidden_size=16, num_layers=3, num_heads=2)
    layers = distributed.decoder_layers(distributed.TrainingForward(policy=model))
    assert layers == list(model.model.layers)
    with pytest.raises(ValueError, match=r"distributed.strategy = 'fsdp2': the model names no decoder layer class"):
        distributed.decoder_layers(torch.nn.Linear(2, 2))


@pytest.fixture(scope="module")
def sft_model(tmp_path_factory):
    """A tiny model that answers 1-digit sums right about a third of the time: rewards within a group differ."""
    from test_grpo_learning import supervised_tiny_model

    return supervised_tiny_model(tmp_path_factory.mktemp("sft") / "model", steps=150)


def overrides(model, output_dir, **extra) -> list[str]:
    values = {
        "model.path": str(model), "model.autocast": "null", "env.kwargs": TASK_KWARGS, "env.max_new_tokens": "6",
        "env.use_chat_template": "false", "env.eval_size": "8", "optim.lr": "1e-3", "run.steps": "3",
        "run.save_every": "1", "run.keep_last": "3", "run.progress": "false", "run.tensorboard": "false",
        "run.plots": "false", "run.output_dir": str(output_dir), "loss.micro_batch_size": "3", **extra,
    }
    return [part for key, value in values.items() for part in (f"--{key}", value)]


ALGORITHM_SETTINGS = {
    "grpo": {"rollout.prompts_per_step": "4", "rollout.group_size": "4", "grpo.num_iterations": "2"},
    # Dynamic sampling: ranks keep different numbers of groups, often none on one rank.
    "dapo": {"rollout.prompts_per_step": "4", "rollout.group_size": "4", "grpo.overlong_cache": "2",
             "grpo.max_sampling_rounds": "3"},
    # A separate critic, whitened advantages and an adaptive KL: every batch statistic crosses ranks. No value clip: it is
    # per token (nothing crosses ranks), and a value within rounding of its clip edge takes either branch of the clipped
    # loss, which parted the two runs' critics by 2% on an Intel Xeon (AVX512-BF16) where the EPYC's agreed. The critic
    # learns at the policy's rate: at the default 10x (1e-2, 12 Adam steps) it moved 39% of its scale in 3 steps, and
    # rounding that large a trajectory amplifies parted the two runs by 2.5e-4 on an AMD EPYC's AVX2 kernels (1.6e-6 now).
    "ppo": {"rollout.prompts_per_step": "6", "rollout.group_size": "2", "ppo.value_model": "separate",
            "ppo.kl_target": "1.0", "ppo.num_minibatches": "2", "ppo.ppo_epochs": "2", "ppo.value_clip": "null",
            "ppo.critic_lr": "1e-3"},
}


RLVR = str(Path(sys.executable).with_name("rlvr"))  # the installed command
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{ROOT}"}


def torchrun(ranks: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]


def launch(command: list[str], ranks: int, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    """The python script ``command`` under torchrun with ``ranks`` processes (1: one plain process), or any
    executable under torchrun with a leading "--no-python"; fails on a non-zero exit or a hang."""
    command = [*torchrun(ranks), *command] if ranks > 1 else [sys.executable, *command]
    try:
        done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise AssertionError(f"{ranks} ranks did not finish in {timeout} s (a hang?):\n{error.stderr}") from None
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def worker_args(algo: str, output_dir: Path, model, *extra: str, **settings) -> list[str]:
    """The worker's arguments for one run of ``algo`` (its ALGORITHM_SETTINGS, then ``settings``)."""
    return [algo, *extra, *overrides(model, output_dir, **{**ALGORITHM_SETTINGS[algo], **settings})]


def weight_records(output_dir: Path) -> list[dict]:
    """The worker's weights.jsonl of a run: a record per step."""
    return [json.loads(line) for line in (output_dir / "weights.jsonl").read_text().splitlines()]


def run_worker(algo: str, output_dir: Path, model, ranks: int, *extra: str, **settings) -> list[dict]:
    launch([str(WORKER), *worker_args(algo, output_dir, model, *extra, **settings)], ranks)
    return weight_records(output_dir)


def run_workers(runs: list[tuple[str, Path, dict]], model, ranks: int) -> dict[Path, list[dict]]:
    """Several (algo, output_dir, settings) runs, one after the other in one launch (the worker's --then: one set of
    imports and one process group for all): {output_dir: its weights.jsonl records}."""
    args: list[str] = []
    for algo, output_dir, settings in runs:
        args += [*(["--then"] if args else []), *worker_args(algo, output_dir, model, **settings)]
    launch([str(WORKER), *args], ranks, timeout=RUN_TIMEOUT_S * len(runs))
    return {output_dir: weight_records(output_dir) for _, output_dir, _ in runs}


LORA = {"lora.r": "4", "lora.alpha": "8", "optim.lr": "1e-2", "grpo.beta": "0.04"}
# The runs trained on one process and on 2 ranks under each strategy: name -> (algo, settings)
COMPARED = {"grpo": ("grpo", {}), "dapo": ("dapo", {}), "ppo": ("ppo", {}), "grpo-lora": ("grpo", LORA)}


@pytest.fixture(scope="module")
def compared_runs(sft_model, tmp_path_factory):
    """Every COMPARED run on one process (one launch) and on 2 ranks under DDP and FSDP2 (one torchrun launch):
    {(name, "one" | strategy): (weights records, output dir)}."""
    root = tmp_path_factory.mktemp("compared")
    planned = {(name, where): (algo, root / f"{name}-{where}",
                               settings if where == "one" else {**settings, "distributed.strategy": where})
               for name, (algo, settings) in COMPARED.items() for where in ("one", "ddp", "fsdp2")}
    records = {}
    for ranks, places in ((1, ("one",)), (2, ("ddp", "fsdp2"))):
        runs = [run for (_, where), run in planned.items() if where in places]
        records.update(run_workers(runs, sft_model, ranks))
    return {key: (records[output_dir], output_dir) for key, (_, output_dir, _) in planned.items()}


def largest_difference(a: dict, b: dict) -> float:
    """The largest relative difference between two weight summaries (worker.weights_summary): each sum's difference
    over its scale (the sum of |terms|: a signed sum's terms cancel, and rounding scales with them, not with it)."""
    return max(abs(x - y) / max(1.0, abs(scale)) for name in a
               for (x, y), scale in zip(zip(a[name], b[name]), (a[name][0], a[name][2], a[name][2])))


def moved(records: list[dict]) -> float:
    return largest_difference(records[0]["weights"], records[-1]["weights"])


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
@pytest.mark.parametrize("algo", ["grpo", "dapo", "ppo"])
def test_two_ranks_train_the_weights_one_process_trains(algo, strategy, compared_runs):
    (one, one_dir), (two, two_dir) = compared_runs[algo, "one"], compared_runs[algo, strategy]
    assert [r["step"] for r in two] == [1, 2, 3] and not any(r["skipped"] for r in one + two)
    differences = [largest_difference(a["weights"], b["weights"]) for a, b in zip(one, two)]
    print(f"{algo} {strategy}: 1 vs 2 ranks, largest relative difference per step {differences}; moved {moved(one):.3g}")
    assert max(differences) < TOLERANCE
    assert moved(one) > max(1e-3, 100 * max(differences))  # the comparison is not between untrained copies
    metrics = [json.loads(line) for line in (two_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["world_size"] == 2 and metrics[0]["distributed_strategy"] == strategy
    saved = load_config_file(two_dir / "config.yaml")
    assert saved["distributed"]["world_size"] == 2 and saved["distributed"]["strategy"] == strategy
    # rank 0's transformers export holds the trained weights whole
    export = load_file(latest_checkpoint(two_dir) / "model" / "model.safetensors")
    reference = load_file(latest_checkpoint(one_dir) / "model" / "model.safetensors")
    assert export.keys() == reference.keys()
    assert max((export[k] - reference[k]).abs().max().item() for k in export) < TOLERANCE


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_ranks_train_the_lora_adapter_one_process_trains(strategy, compared_runs):
    """LoRA under DDP and FSDP2: only the adapters have gradients to reduce, and 2 ranks end where one process does,
    the KL reference (the adapter disabled) included; rank 0 exports the adapter whole."""
    (one, one_dir), (two, two_dir) = compared_runs["grpo-lora", "one"], compared_runs["grpo-lora", strategy]
    differences = [largest_difference(a["weights"], b["weights"]) for a, b in zip(one, two)]
    print(f"grpo lora {strategy}: 1 vs 2 ranks, largest relative difference per step {differences}; moved {moved(one):.3g}")
    assert [r["step"] for r in two] == [1, 2, 3] and max(differences) < TOLERANCE
    assert moved(one) > max(1e-3, 100 * max(differences))
    export, reference = (load_file(latest_checkpoint(run) / "model" / "adapter_model.safetensors")
                         for run in (two_dir, one_dir))
    assert export.keys() == reference.keys() and all("lora_" in k for k in export)
    assert max((export[k] - reference[k]).abs().max().item() for k in export) < TOLERANCE


def test_a_non_finite_loss_on_one_rank_skips_the_step_on_every_rank(sft_model, tmp_path):
    records = run_worker("grpo", tmp_path, sft_model, 2, "--nan-on-rank", "1", "--nan-at-step", "2",
                         **{"grpo.num_iterations": "1"})
    assert [r["skipped"] for r in records] == [0.0, 1.0, 0.0]
    assert records[1]["weights"] == records[0]["weights"]  # step 2 moved nothing, on either rank (checked equal)
    assert records[2]["weights"] != records[1]["weights"]


@pytest.mark.parametrize("first, then", [(2, 1), (1, 2)])
def test_a_checkpoint_resumes_on_another_number_of_ranks(first, then, sft_model, compared_runs, tmp_path):
    """Steps 1-2 on ``first`` ranks, step 3 resumed on ``then`` through the `rlvr` command: the weights of the
    uninterrupted one-process run. Under FSDP2 the checkpoint is sharded; it loads whole into one process."""
    settings = {**ALGORITHM_SETTINGS["grpo"], "distributed.strategy": "fsdp2"}
    whole_dir = compared_runs["grpo", "one"][1]
    run_worker("grpo", tmp_path / "cut", sft_model, first, **settings, **{"run.steps": "2"})
    launch([RLVR, "train", "--algo", "grpo", "--resume", *overrides(sft_model, tmp_path / "cut", **settings)], then)
    assert [p.name for p in list_checkpoints(tmp_path / "cut")] == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    resumed = load_file(latest_checkpoint(tmp_path / "cut") / "model" / "model.safetensors")
    whole = load_file(latest_checkpoint(whole_dir) / "model" / "model.safetensors")
    assert max((resumed[k] - whole[k]).abs().max().item() for k in whole) < TOLERANCE
    assert load_config_file(tmp_path / "cut" / "config.yaml")["distributed"]["world_size"] == then


def test_a_prompt_count_that_does_not_split_across_ranks_is_a_config_error(sft_model, tmp_path):
    three_prompts = overrides(sft_model, tmp_path, **{"rollout.prompts_per_step": "3"})
    command = ["--no-python", RLVR, "train", "--algo", "grpo", *three_prompts]
    with pytest.raises(AssertionError, match=r"config rollout.prompts_per_step: 3 prompts do not split across 2 processes"):
        launch(command, 2)
    assert not (tmp_path / "config.yaml").exists()


@pytest.mark.parametrize("sampling", [[], ["--samples", "3"]], ids=["greedy", "sampled"])
def test_rlvr_eval_splits_the_problems_across_ranks_and_scores_as_one_process(sft_model, sampling, tmp_path):
    """Sampled: each row's seed is fixed by its position among all the evaluation's rows, so 2 ranks draw the tokens
    1 process draws."""
    command = [RLVR, "eval", "--model", str(sft_model), "--env.kwargs", TASK_KWARGS, "--env.use_chat_template", "false",
               "--env.max_new_tokens", "6", "--num-problems", "25", "--env.eval_batch_size", "4", "--model.autocast", "null",
               *sampling]
    one, two = (launch([*command, "--output", str(tmp_path / f"{ranks}.jsonl")], ranks) for ranks in (1, 2))
    assert len(two.stdout.strip().splitlines()) == 1  # rank 0 prints the result
    report = json.loads(one.stdout)
    assert json.loads(two.stdout) == report and report["accuracy" if not sampling else "pass@1"] > 0
    written = (tmp_path / "1.jsonl").read_text()  # what the model wrote: every rank's rows, in the problems' order
    assert len(written.splitlines()) == 25 * (3 if sampling else 1) and (tmp_path / "2.jsonl").read_text() == written
    if sampling:
        assert report["pass@1"] < report["pass@3"] < 1  # sampled at temperature 1: answers vary


def test_one_rank_killed_mid_step_loses_nothing_past_the_last_checkpoint(sft_model, tmp_path):
    """SIGKILL of rank 1 inside step 3's update: torchrun stops the run; resumed from checkpoint-2, it ends where
    an uninterrupted run does."""
    uninterrupted = run_worker("grpo", tmp_path / "whole", sft_model, 2, **{"run.steps": "4"})
    killed = subprocess.run([*torchrun(2), str(WORKER), *worker_args("grpo", tmp_path / "cut", sft_model, "--kill-rank",
                                                                     "1", "--kill-at-step", "3", **{"run.steps": "4"})],
                            env=ENV, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert killed.returncode != 0 and latest_checkpoint(tmp_path / "cut").name == "checkpoint-2"
    resumed = run_worker("grpo", tmp_path / "cut", sft_model, 2, "--resume", **{"run.steps": "4"})
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]  # the killed run's steps 1-2, then the resumed 3-4
    assert resumed[-1]["weights"] == uninterrupted[-1]["weights"]


@pytest.mark.slow
def test_grpo_learns_under_torchrun(tmp_path):
    """The learning test's GRPO run (tests/test_grpo_learning.py), by `rlvr train` on 2 ranks: held-out accuracy
    rises by the same margin."""
    from test_grpo_learning import MARGIN, learning_overrides, supervised_tiny_model

    model = supervised_tiny_model(tmp_path / "sft")
    values = learning_overrides(model, tmp_path / "run", **{"run.plots": "false"})
    command = ["--no-python", RLVR, "train", "--algo", "grpo", *[p for k, v in values.items() for p in (f"--{k}", v)]]
    summary = json.loads(launch(command, 2, timeout=900).stdout.strip().splitlines()[-1])
    before, after = summary["eval_accuracy_before"], summary["eval_accuracy_after"]
    print(f"grpo on 2 ranks: held-out accuracy {before:.3f} -> {after:.3f}")
    assert before < 0.5 and after >= before + MARGIN
