"""model.autocast = "auto" and the machine description (algos/hardware.py): the choice on each kind of
device from what torch reports and a measured matmul, the one warning for an emulated half precision,
and what a run records of both (config.yaml, machine.json, the log)."""

from __future__ import annotations

import json
import logging
import warnings

import pytest
import torch
import yaml
from reference_helpers import save_tiny_model

from algos import hardware
from algos.config import load_config
from algos.grpo import GRPOConfig, GRPOTrainer
from algos.runtime import compute_dtype, mixed_precision
from rlvr_env.testing import build_char_tokenizer, build_tiny_model

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh_warnings():
    hardware.warn_emulated.cache_clear()  # each test sees its own "warn once"
    yield
    hardware.warn_emulated.cache_clear()


def fake_cpu(monkeypatch, units: list[str], bf16_speedup: float) -> list[str]:
    """A CPU reporting ``units`` whose half-precision matmul runs ``bf16_speedup`` times fp32's speed; returns
    the dtypes probed."""
    probed = []

    def half_speed(dtype, model):
        probed.append(dtype)
        return bf16_speedup, f"64x576 @ 576x1536: measured {dtype}"

    monkeypatch.setattr(hardware, "cpu_bf16_units", lambda: units)
    monkeypatch.setattr(hardware, "cpu_half_speed", half_speed)
    return probed


def fake_gpu(monkeypatch, bf16: bool) -> torch.device:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100" if not bf16 else "NVIDIA H100")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16)
    return torch.device("cuda", 0)


@pytest.mark.parametrize(("units", "speedup", "chosen", "reason"), [
    ([], 0.02, None, "neither AVX512-BF16 nor AMX, so bf16 is emulated (64x576 @ 576x1536: measured bfloat16): fp32"),
    (["AVX512-BF16"], 2.0, "bfloat16", "CPU AVX512-BF16: bf16 runs natively (64x576 @ 576x1536: measured bfloat16)"),
    (["AVX512-BF16", "AMX-BF16"], 1.3, "bfloat16", "CPU AVX512-BF16/AMX-BF16: bf16 runs natively"),
    # torch reports the unit, but oneDNN does not use it (ONEDNN_MAX_CPU_ISA=AVX2): the measurement decides
    (["AVX512-BF16"], 0.03, None, "torch reports AVX512-BF16, but bf16 measured no faster than fp32"),
    (["AMX-BF16"], 1.2, None, "measured no faster than fp32"),  # within the noise margin: fp32 is the safe side
])
def test_auto_on_a_cpu_is_bf16_only_where_it_is_native_and_measured_faster(monkeypatch, units, speedup, chosen, reason):
    probed = fake_cpu(monkeypatch, units, speedup)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "auto" never warns: it chose
        precision = hardware.resolve_autocast("auto", CPU)
    assert (precision.requested, precision.autocast) == ("auto", chosen)
    assert reason in precision.reason
    assert probed == ["bfloat16"]


def test_null_is_fp32_without_measuring_anything(monkeypatch):
    probed = fake_cpu(monkeypatch, [], 0.02)
    assert hardware.resolve_autocast(None, CPU) == hardware.Precision(None, None, "model.autocast = null: fp32 matmuls")
    assert probed == []


def test_an_explicit_bf16_on_a_cpu_that_emulates_it_is_kept_with_one_warning_naming_the_fix(monkeypatch):
    fake_cpu(monkeypatch, [], 1 / 68.0)
    with pytest.warns(UserWarning) as caught:
        first = hardware.resolve_autocast("bfloat16", CPU)
        second = hardware.resolve_autocast("bfloat16", CPU)
    assert first.autocast == second.autocast == "bfloat16"  # what the user asked for
    assert len(caught) == 1  # once, not once per call
    message = str(caught[0].message)
    assert message.startswith("model.autocast = 'bfloat16' is 68x slower than fp32 on this CPU (64x576 @ 576x1536")
    assert "bf16 units reported: none" in message
    assert message.endswith("use model.autocast = 'auto' or null")


def test_an_explicit_half_dtype_that_runs_fast_is_kept_silently(monkeypatch):
    fake_cpu(monkeypatch, ["AVX512-BF16"], 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        precision = hardware.resolve_autocast("bfloat16", CPU)
    assert precision.autocast == "bfloat16" and precision.reason.startswith("model.autocast = 'bfloat16' as configured")


def test_a_slightly_slower_half_dtype_is_not_called_emulated(monkeypatch):
    fake_cpu(monkeypatch, ["AVX512-BF16"], 0.9)  # noise, not emulation
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hardware.resolve_autocast("float16", CPU).autocast == "float16"


@pytest.mark.parametrize(("bf16", "chosen", "reason"), [
    (True, "bfloat16", "NVIDIA H100 computes bf16 natively"),
    (False, "float16", "Tesla V100 has no bf16 units (pre-Ampere): fp16 with loss scaling"),
])
def test_auto_on_a_gpu_is_bf16_where_it_has_the_units_and_fp16_elsewhere(monkeypatch, bf16, chosen, reason):
    precision = hardware.resolve_autocast("auto", fake_gpu(monkeypatch, bf16))
    assert (precision.autocast, precision.reason) == (chosen, reason)


def test_an_explicit_bf16_on_a_pre_ampere_gpu_warns_and_names_auto(monkeypatch):
    emulated = r"Tesla V100 has no bf16 units \(pre-Ampere\) and emulates it; use model.autocast = 'auto'"
    with pytest.warns(UserWarning, match=emulated):
        assert hardware.resolve_autocast("bfloat16", fake_gpu(monkeypatch, bf16=False)).autocast == "bfloat16"


def test_auto_on_another_device_type_is_fp32():
    precision = hardware.resolve_autocast("auto", torch.device("meta"))
    assert precision.autocast is None and "no bf16 detection for meta devices" in precision.reason


def test_the_probe_measures_the_models_own_shape():
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2)
    rows, hidden, intermediate = hardware.probe_shape(model)
    assert (rows, hidden, intermediate) == (64, 32, model.config.intermediate_size)
    assert hardware.probe_shape(None) == (64, 576, 2304)  # no model: SmolLM2-135M's hidden size, a 4x MLP
    speedup, measured = hardware.cpu_half_speed("bfloat16", model)
    assert speedup > 0 and measured.startswith(f"64x32 @ 32x{intermediate}: ") and measured.endswith(" ms float32")
    assert hardware.cpu_matmul_ms("float32", 4, 8, 8) > 0


def test_a_machine_description_names_what_the_numbers_depend_on():
    machine = hardware.describe_machine(CPU)
    assert machine["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert machine["torch_threads"] == torch.get_num_threads() and machine["cpu_cores"] >= 1
    assert machine["memory_gib"] > 0 and machine["device"] == "cpu" and machine["torch"] == torch.__version__
    assert set(machine["cpu_bf16_units"]) <= {"AVX512-BF16", "AMX-BF16"}
    line = hardware.machine_line(machine, hardware.Precision("auto", None, "why"))
    assert line.startswith("device cpu: ") and line.endswith("autocast auto -> None (why)")


def test_the_matmul_dtype_must_be_resolved_before_a_run_computes():
    config = load_config(GRPOConfig)
    assert config.model.autocast == "auto"  # the default of every config
    for use in (compute_dtype, lambda model_cfg: mixed_precision(model_cfg, CPU)):
        with pytest.raises(ValueError, match="model.autocast 'auto' must be resolved first"):
            use(config.model)


def test_a_run_records_the_resolved_precision_and_the_machine(monkeypatch, tmp_path, caplog):
    model_dir = save_tiny_model(tmp_path / "model")
    fake_cpu(monkeypatch, ["AVX512-BF16"], 2.0)
    config = load_config(GRPOConfig, overrides={
        "model.path": str(model_dir), "env.use_chat_template": "false", "run.output_dir": str(tmp_path / "run"),
        "run.progress": "false", "run.tensorboard": "false",
    })
    with caplog.at_level(logging.INFO, logger="rlvr"):
        trainer = GRPOTrainer(config)
    assert trainer.run.config.model.autocast == "bfloat16"
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["model"]["autocast"] == "bfloat16"  # what ran, so the file replays it on any machine
    machine = json.loads((tmp_path / "run" / "machine.json").read_text())
    assert machine["precision"] == {"requested": "auto", "autocast": "bfloat16",
                                    "reason": "CPU AVX512-BF16: bf16 runs natively (64x576 @ 576x1536: measured bfloat16)"}
    assert machine["machine"]["device"] == "cpu"
    assert any(record.getMessage().startswith("device cpu: ") and "autocast auto -> bfloat16" in record.getMessage()
               for record in caplog.records)


def test_the_probe_leaves_the_runs_random_stream_alone():
    hardware.cpu_matmul_ms.cache_clear()
    torch.manual_seed(0)
    hardware.cpu_half_speed("bfloat16", None)
    probed = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(probed, torch.rand(3))
