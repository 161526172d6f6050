"""Rows per micro-batch from a memory budget (algos/system/memory.py, loss.micro_batch_memory_gb): saved-tensor bytes
by hand, the fit, the probe rows, and a bound that holds on a real model's batch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from reference_helpers import save_tiny_model
from safetensors.torch import load_file

from algos.algorithms import grpo
from algos.algorithms.grpo import GRPOConfig, GRPOTrainer
from algos.algorithms.ppo import PPOConfig
from algos.config import load_config
from algos.learn import micro_batches
from algos.model.policy import completion_logprobs
from algos.run.reporting import read_metrics
from algos.system.memory import ActivationCost, activation_cost, fixed_micro_batch_rows, free_accelerator_bytes, saved_bytes
from algos.system.paths import latest_checkpoint
from rlvr_env.testing import build_char_tokenizer, build_tiny_model


def test_saved_bytes_counts_what_autograd_keeps_less_the_weights():
    x = torch.randn(10, 4, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(4))
    assert saved_bytes(lambda: (x * weight).sum(), [weight]) == 10 * 4 * 4  # mul keeps x and weight; weight is resident
    assert saved_bytes(lambda: (x * weight).sum()) == 10 * 4 * 4 + 4 * 4
    assert saved_bytes(lambda: torch.exp(x).sum()) == 10 * 4 * 4  # exp keeps its output
    assert saved_bytes(lambda: x.sum()) == 0  # a sum's gradient needs no tensor
    with torch.no_grad():
        assert saved_bytes(lambda: torch.exp(x).sum()) == 0  # nothing is kept without a graph


@pytest.mark.parametrize(("budget", "most", "rows"), [
    (300, 8, 4),  # (300 - 100) // 50
    (300, 3, 3),  # at most loss.micro_batch_size
    (120, 8, 1),  # less than a row fits: one row, which cannot be split
    (50, 8, 1),  # less than the fixed part
])
def test_rows_within_a_budget(budget, most, rows):
    assert ActivationCost(fixed_bytes=100, row_bytes=50).rows_within(budget, most) == rows
    assert ActivationCost(fixed_bytes=0, row_bytes=1).rows_within(budget, most=1000) == budget  # a byte a row


def test_the_probe_splits_what_rows_cost_from_what_a_forward_keeps_whatever_its_rows():
    x = torch.randn(6, 4, requires_grad=True)
    fixed = torch.randn(8, requires_grad=True)
    prompts = torch.arange(6)[:, None]  # six groups
    # Each row keeps its own 24 bytes (pow's 4 fp32 inputs, the gather's int64 index): no fixed part.
    assert activation_cost(lambda rows: (x[rows] * 2).pow(2).sum(), prompts, [x]) == ActivationCost(0, 24)
    # A forward keeping the same 32 bytes (exp's output) whatever its rows: the least a row costs, 1 byte; the rest fixed.
    assert activation_cost(lambda rows: fixed.exp().sum(), prompts, [x]) == ActivationCost(31, 1)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_tiny_model(build_char_tokenizer(), hidden_size=32, num_layers=2, num_heads=4).eval()


def grouped_batch(groups: int = 3, group_size: int = 4, prompt_width: int = 6, completion: int = 5):
    torch.manual_seed(1)
    prompts = torch.randint(4, 50, (groups, prompt_width)).repeat_interleave(group_size, 0)
    ids = torch.cat([prompts, torch.randint(4, 50, (groups * group_size, completion))], 1)
    return ids, torch.ones_like(ids), prompt_width


def test_the_probe_takes_two_rows_with_different_prompts_and_bounds_a_real_micro_batch(model):
    ids, mask, width = grouped_batch()
    probed = []

    def forward_rows(rows):
        probed.append(rows.tolist())
        return completion_logprobs(model, ids[rows], mask[rows], width)

    cost = activation_cost(forward_rows, ids[:, :width], model.parameters())
    assert probed == [[0], [0, 4]]  # row 4 starts the second group: each probe row pays for its own prompt
    assert cost.row_bytes > 0
    for rows in (1, 2, 5, 12):
        kept = saved_bytes(lambda r=rows: forward_rows(torch.arange(r)), model.parameters())
        # an upper bound (groups share their prompt's activations), and not a loose one
        assert 0.5 * (cost.fixed_bytes + rows * cost.row_bytes) <= kept <= cost.fixed_bytes + rows * cost.row_bytes


def test_the_probe_takes_the_longest_rows_and_bounds_a_ragged_batch(model):
    ids, mask, width = grouped_batch()
    for row, length in enumerate([5, 2, 3, 1, 4, 5, 1, 2, 2, 3, 5, 1]):  # completions end early: right padding
        mask[row, width + length :] = 0
    probed = []

    def forward_rows(rows):
        probed.append(rows.tolist())
        return completion_logprobs(model, ids[rows], mask[rows], width)

    cost = activation_cost(forward_rows, ids[:, :width], model.parameters(), mask.sum(-1))
    assert probed == [[0], [0, 5]]  # row 0 is the longest (the first of three), row 5 the longest of another group
    for rows in ([0, 5, 10], [3, 6, 11], list(range(12))):
        kept = saved_bytes(lambda r=rows: forward_rows(torch.tensor(r)), model.parameters())
        assert kept <= cost.fixed_bytes + len(rows) * cost.row_bytes


def test_a_batch_of_one_group_probes_its_first_two_rows(model):
    ids, mask, width = grouped_batch(groups=1, group_size=4)
    probed = []
    activation_cost(lambda rows: probed.append(rows.tolist()) or completion_logprobs(model, ids[rows], mask[rows], width),
                    ids[:, :width], model.parameters())
    assert probed == [[0], [0, 1]]  # no row with another prompt: the next row


def test_a_one_row_batch_is_its_own_row_cost(model):
    ids, mask, width = grouped_batch(groups=1, group_size=1)
    cost = activation_cost(lambda rows: completion_logprobs(model, ids[rows], mask[rows], width), ids[:, :width],
                           model.parameters())
    assert cost.fixed_bytes == 0 and cost.row_bytes == saved_bytes(
        lambda: completion_logprobs(model, ids, mask, width), model.parameters())


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def grpo_config(model_dir, output_dir, **extra) -> GRPOConfig:
    overrides = {
        # the CPU, also on a GPU host: these tests pin the sizing logic, faking the GPU's free memory where they need it
        "model.path": str(model_dir), "model.device": "cpu", "model.autocast": "null", "env.kwargs": '{"digits": 1, "terms": 2}',
        "env.max_new_tokens": "4", "env.use_chat_template": "false", "env.eval_size": "4", "optim.lr": "1e-3",
        "run.output_dir": str(output_dir), "run.steps": "2", "run.eval_every": "0", "run.progress": "false",
        "run.tensorboard": "false", "run.plots": "false", "rollout.prompts_per_step": "3", "rollout.group_size": "4",
        "loss.entropy_coef": "0.01", **extra,
    }
    return load_config(GRPOConfig, overrides=overrides)


def train_grpo(model_dir, output_dir, **extra):
    GRPOTrainer(grpo_config(model_dir, output_dir, **extra)).train()
    return read_metrics(output_dir), load_file(latest_checkpoint(output_dir) / "model" / "model.safetensors")


def test_the_trainer_probes_again_only_for_a_wider_batch(tiny_model_dir, tmp_path, monkeypatch):
    trainer = GRPOTrainer(grpo_config(tiny_model_dir, tmp_path, **{"loss.micro_batch_memory_gb": "100"}))
    probed = []
    monkeypatch.setattr(micro_batches, "activation_cost",
                        lambda *args: probed.append(tuple(args[1].shape)) or ActivationCost(0, 1))

    def batch(prompt_width, width):
        ids = torch.randint(4, 50, (4, width))
        return SimpleNamespace(prompt_width=prompt_width, input_ids=ids, attention_mask=torch.ones_like(ids), num_rows=4)

    for prompt_width, width in [(6, 10), (6, 9), (5, 10), (7, 10), (6, 10), (7, 12), (7, 12)]:
        assert trainer._micro_batch_rows(batch(prompt_width, width)) == 8  # the budget holds loss.micro_batch_size rows
    assert probed == [(4, 6), (4, 7), (4, 7)]  # the first batch, a wider prompt, a wider batch


def test_the_trainers_probe_measures_the_updates_forward_and_sizes_rows_in_gib(tiny_model_dir, tmp_path, monkeypatch):
    trainer = GRPOTrainer(grpo_config(tiny_model_dir, tmp_path, **{
        "rollout.temperature": "0.7", "loss.logprob_chunk_size": "3", "loss.micro_batch_size": "auto"}))
    ids, mask, width = grouped_batch()
    for row, length in enumerate([2, 5, 3, 1, 4, 5, 1, 2, 2, 3, 5, 1]):  # row 0 is not the longest
        mask[row, width + length :] = 0
    batch = SimpleNamespace(prompt_width=width, input_ids=ids, attention_mask=mask, num_rows=12)
    forwards = []
    real_forward = grpo.completion_logprobs

    def recorded_forward(model, input_ids, attention_mask, prompt_width, *options, **named):
        forwards.append((options, named))
        return real_forward(model, input_ids, attention_mask, prompt_width, *options, **named)

    monkeypatch.setattr(grpo, "completion_logprobs", recorded_forward)
    cost = activation_cost(lambda rows: real_forward(trainer.model, ids[rows], mask[rows], width, 0.7, 3, len(trainer.tokenizer)),
                           ids[:, :width], trainer.model.parameters(), mask.sum(-1))
    gib = 1024**3
    # An explicit budget one byte short of 4 rows: 3.
    trainer.config.loss.micro_batch_memory_gb = (cost.fixed_bytes + 4 * cost.row_bytes - 1) / gib
    assert trainer._micro_batch_rows(batch) == 3
    assert trainer.micro_batch_sizer.probed[1] == cost  # the longest rows, as the update's forward computes them
    assert forwards == [((0.7, 3, len(trainer.tokenizer)), {})] * 2  # the probe's two passes
    # No budget on a GPU: half its free memory, here exactly 3 rows' worth.
    trainer.config.loss.micro_batch_memory_gb = None
    monkeypatch.setattr(micro_batches, "free_accelerator_bytes", lambda device: 2 * (cost.fixed_bytes + 3 * cost.row_bytes))
    assert trainer._micro_batch_rows(batch) == 3
    # A rank without rows (its batch None) takes one and probes nothing: the others' probe decides.
    trainer.micro_batch_sizer.probed = None
    assert trainer._micro_batch_rows(None) == 1 and trainer.micro_batch_sizer.probed is None


def test_a_budget_picks_the_rows_and_the_step_computes_the_same(tiny_model_dir, tmp_path):
    tight, tight_weights = train_grpo(tiny_model_dir, tmp_path / "tight", **{"loss.micro_batch_memory_gb": "1e-9"})
    roomy, _ = train_grpo(tiny_model_dir, tmp_path / "roomy", **{"loss.micro_batch_memory_gb": "100"})
    one_row, one_row_weights = train_grpo(tiny_model_dir, tmp_path / "one", **{"loss.micro_batch_size": "1"})
    steps = [r for r in tight if "micro_batch_rows" in r]
    assert [r["micro_batch_rows"] for r in steps] == [1.0, 1.0]  # nothing fits: one row at a time
    assert [r["micro_batch_rows"] for r in roomy if "micro_batch_rows" in r] == [8.0, 8.0]  # loss.micro_batch_size
    for key, weight in one_row_weights.items():  # gradient accumulation is exact: the same step as 1-row micro-batches
        torch.testing.assert_close(tight_weights[key], weight, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("free_bytes", "rows"), [
    (None, 8),  # a CPU: TRL's 8 rows, the fastest measured there
    (10**12, 12),  # a GPU with room: the whole batch (3 prompts x 4) in one pass
    (1, 1),  # a GPU with none: one row at a time
])
def test_auto_micro_batch_is_8_rows_on_a_cpu_and_what_fits_on_a_gpu(tiny_model_dir, tmp_path, monkeypatch, free_bytes,
                                                                   rows):
    seen = []
    monkeypatch.setattr(micro_batches, "free_accelerator_bytes", lambda device: seen.append(device.type) or free_bytes)
    metrics, _ = train_grpo(tiny_model_dir, tmp_path, **{"loss.micro_batch_size": "auto"})
    assert seen == ["cpu", "cpu"]  # asked of the trainer's device, once per update
    assert [r["micro_batch_rows"] for r in metrics if "micro_batch_rows" in r] == [rows, rows]


def test_auto_micro_batch_on_a_gpu_keeps_an_explicit_budget(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(micro_batches, "free_accelerator_bytes", lambda device: 10**12)
    metrics, _ = train_grpo(tiny_model_dir, tmp_path, **{"loss.micro_batch_memory_gb": "1e-9"})
    assert [r["micro_batch_rows"] for r in metrics if "micro_batch_rows" in r] == [1.0, 1.0]


def test_free_accelerator_bytes_counts_the_allocators_unused_cache(monkeypatch):
    assert free_accelerator_bytes(torch.device("cpu")) is None
    gpu = torch.device("cuda", 1)  # the trainer's GPU, not the current one
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1000, 8000) if device == gpu else (0, 0))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 300 if device == gpu else 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 200 if device == gpu else 0)
    assert free_accelerator_bytes(gpu) == 1000 + 300 - 200


def test_the_warm_starts_fixed_passes_read_auto_as_the_cpus_rows():
    assert fixed_micro_batch_rows("auto") == 8
    assert fixed_micro_batch_rows(3) == 3


def test_micro_batch_size_is_auto_or_a_positive_number_of_rows():
    assert load_config(GRPOConfig).loss.micro_batch_size == "auto"
    assert load_config(GRPOConfig, overrides={"loss.micro_batch_size": "4"}).loss.micro_batch_size == 4
    for bad in ("0", "big"):
        with pytest.raises(ValueError, match="config loss.micro_batch_size: must be 'auto' or a number of rows >= 1"):
            load_config(GRPOConfig, overrides={"loss.micro_batch_size": bad}).validate()
    load_config(PPOConfig, overrides={"loss.micro_batch_size": "auto", "loss.micro_batch_memory_gb": "2"}).validate()


def test_a_bad_memory_budget_is_named():
    with pytest.raises(ValueError, match=r"config loss.micro_batch_memory_gb: must be > 0 \(GiB\) or null"):
        load_config(GRPOConfig, overrides={"loss.micro_batch_memory_gb": "0"}).validate()

