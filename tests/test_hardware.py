"""model.autocast = "auto" and the machine description (algos/system/hardware.py): the choice on each kind of
device from what torch reports and a measured matmul, the one warning for an emulated half precision,
and what a run records of both (config.yaml, machine.json, the log)."""

from __future__ import annotations

import io
import json
import logging
import os
import warnings

import pytest
import torch
import yaml
from reference_helpers import save_tiny_model

from algos.algorithms.grpo import GRPOConfig, GRPOTrainer
from algos.config import load_config
from algos.system import hardware
from algos.system.runtime import compute_dtype, mixed_precision
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
    rows, hidden, intermediate = hardware.probe_shape(model.config)
    assert (rows, hidden, intermediate) == (64, 32, model.config.intermediate_size)
    assert hardware.probe_shape(None) == (64, 576, 2304)  # no model: SmolLM2-135M's hidden size, a 4x MLP
    speedup, measured = hardware.cpu_half_speed("bfloat16", model.config)
    assert speedup > 0 and measured.startswith(f"64x32 @ 32x{intermediate}: ") and measured.endswith(" ms float32")
    assert hardware.cpu_matmul_ms("float32", 4, 8, 8) > 0


def test_a_machine_description_names_what_the_numbers_depend_on():
    machine = hardware.describe_machine(CPU)
    assert machine["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert machine["torch_threads"] == torch.get_num_threads() and machine["cpu_cores"] >= 1
    assert machine["memory_gib"] > 0 and machine["device"] == "cpu" and machine["torch"] == torch.__version__
    assert set(machine["cpu_bf16_units"]) <= {"AVX512-BF16", "AMX-BF16"}
    line = hardware.machine_line(machine, hardware.Precision("auto", None, "why"))
    assert line.startswith("device cpu: ") and line.endswith("autocast auto -> off (why)")  # "off", not "None"


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
        "run.progress": "false", "run.tensorboard": "false", "model.device": "cpu",  # the faked CPU's choice
    })
    with caplog.at_level(logging.INFO, logger="rlvr"):
        trainer = GRPOTrainer(config)
    assert trainer.run.config.model.autocast == "bfloat16"
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["model"]["autocast"] == "bfloat16"  # what ran, so the file replays it on any machine
    assert saved["model"]["compile_layers"] == "off"  # "auto" on a CPU
    machine = json.loads((tmp_path / "run" / "machine.json").read_text())
    assert machine["compiled_layers"] is False
    assert machine["precision"] == {"requested": "auto", "autocast": "bfloat16",
                                    "reason": "CPU AVX512-BF16: bf16 runs natively (64x576 @ 576x1536: measured bfloat16)"}
    assert machine["machine"]["device"] == "cpu"
    assert any(record.getMessage().startswith("device cpu: ") and "autocast auto -> bfloat16" in record.getMessage()
               for record in caplog.records)
    assert "training forwards: decoder layers eager (model.compile_layers off)" in caplog.messages


def test_a_run_with_compile_layers_on_compiles_the_policy_and_its_reference(monkeypatch, tmp_path, caplog):
    """model.compile_layers "on" (what "auto" resolves to on one CUDA process): setup compiles the policy's decoder
    layers and the KV reference's, logs it and records it (the compiling itself is tests/test_grpo_machinery.py's)."""
    from algos.run import loop

    compiled = []
    monkeypatch.setattr(loop, "compile_decoder_layers", compiled.append)
    config = load_config(GRPOConfig, overrides={
        "model.path": str(save_tiny_model(tmp_path / "model")), "env.use_chat_template": "false",
        "run.output_dir": str(tmp_path / "run"), "run.progress": "false", "run.tensorboard": "false",
        "model.device": "cpu", "model.autocast": "null", "model.compile_layers": "on", "grpo.beta": "0.04",
    })
    with caplog.at_level(logging.INFO, logger="rlvr"):
        trainer = GRPOTrainer(config)
    assert compiled == [trainer.model, trainer.ref_model] and compiled[0] is not compiled[1]
    assert json.loads((tmp_path / "run" / "machine.json").read_text())["compiled_layers"] is True
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["model"]["compile_layers"] == "on"
    assert "training forwards: decoder layers compiled (torch.compile, rows whole) (model.compile_layers on)" in caplog.messages


def test_the_probe_leaves_the_runs_random_stream_alone():
    hardware.cpu_matmul_ms.cache_clear()
    torch.manual_seed(0)
    hardware.cpu_half_speed("bfloat16", None)
    probed = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(probed, torch.rand(3))


# ---------------------------------------------------------------- what is read from torch, the OS and the GPU


@pytest.mark.parametrize(("capabilities", "units"), [
    ({"avx512_bf16": True}, ["AVX512-BF16"]),
    ({"amx_bf16": True}, ["AMX-BF16"]),
    ({"avx512_bf16": True, "amx_bf16": True, "avx2": True}, ["AVX512-BF16", "AMX-BF16"]),
    ({"avx512_bf16": False, "avx2": True}, []),
])
def test_the_bf16_units_are_the_ones_torch_reports(monkeypatch, capabilities, units):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: capabilities, raising=False)
    assert hardware.cpu_capabilities() == capabilities
    assert hardware.cpu_bf16_units() == units


def test_a_torch_without_the_capability_query_reports_nothing(monkeypatch):
    monkeypatch.delattr(torch.cpu, "get_capabilities", raising=False)
    assert hardware.cpu_capabilities() == {} and hardware.cpu_bf16_units() == []


def test_the_half_speed_is_fp32_time_over_half_time(monkeypatch):
    times = {"float32": 3.0, "bfloat16": 1.5}
    monkeypatch.setattr(hardware, "cpu_matmul_ms", lambda dtype, rows, inner, cols: times[dtype])
    assert hardware.cpu_half_speed("bfloat16", None) == (2.0, "64x576 @ 576x2304: 1.50 ms bfloat16 vs 3.00 ms float32")


def fake_gpu_properties(monkeypatch):
    props = type("Props", (), {"name": "NVIDIA H100", "total_memory": int(79.64 * 1024**3), "major": 9, "minor": 0})
    devices = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: devices.append(device) or props)
    return devices


def test_a_machine_description_reads_the_cpu_cores_memory_and_gpu(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_capabilities", lambda: {"cpu_name": "Test CPU", "avx512_bf16": True})
    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.setattr(hardware, "total_memory_bytes", lambda: int(7.96 * 1024**3))
    devices = fake_gpu_properties(monkeypatch)
    machine = hardware.describe_machine(torch.device("cuda", 0))
    assert (machine["cpu"], machine["cpu_bf16_units"], machine["cpu_cores"]) == ("Test CPU", ["AVX512-BF16"], 3)
    assert machine["memory_gib"] == 8.0 and machine["device"] == "cuda:0"
    assert (machine["gpu"], machine["gpu_memory_gib"], machine["gpu_compute_capability"]) == ("NVIDIA H100", 79.6, "9.0")
    assert devices == [torch.device("cuda", 0)]
    line = hardware.machine_line(machine, hardware.Precision("auto", "bfloat16", "why"))
    assert line == ("device cuda:0: NVIDIA H100, 2 torch threads of 3 cores, 8.0 GiB memory; autocast auto -> bfloat16 "
                    "(why)").replace("2 torch", f"{torch.get_num_threads()} torch")


def test_without_a_cpu_name_affinity_or_memory_the_description_falls_back(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_capabilities", lambda: {})
    monkeypatch.setattr(hardware.platform, "processor", lambda: "")
    monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
    monkeypatch.delattr(hardware.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(hardware.os, "cpu_count", lambda: 5)
    monkeypatch.setattr(hardware, "total_memory_bytes", lambda: None)
    machine = hardware.describe_machine(CPU)
    assert (machine["cpu"], machine["cpu_cores"], machine["memory_gib"]) == ("x86_64", 5, None)
    assert "gpu" not in machine
    monkeypatch.setattr(hardware.platform, "processor", lambda: "Some CPU")
    assert hardware.describe_machine(CPU)["cpu"] == "Some CPU"


@pytest.mark.parametrize(("units", "shown"), [([], "(AVX2)"), (["AVX512-BF16", "AMX-BF16"], "(AVX2, AVX512-BF16/AMX-BF16)")])
def test_a_cpu_line_names_its_capability_and_bf16_units(units, shown):
    machine = {"cpu": "EPYC", "cpu_capability": "AVX2", "cpu_bf16_units": units, "torch_threads": 2, "cpu_cores": 2,
               "memory_gib": 23.5, "device": "cpu"}
    line = hardware.machine_line(machine, hardware.Precision(None, None, "fp32"))
    assert line == f"device cpu: EPYC {shown}, 2 torch threads of 2 cores, 23.5 GiB memory; autocast null -> off (fp32)"


def test_the_memory_is_the_cgroups_limit_when_lower(monkeypatch):
    real_open = open

    def limited(path, *args, **kwargs):
        if path == "/sys/fs/cgroup/memory.max":
            return io.StringIO(limit)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", limited)
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    limit = "1073741824\n"
    assert hardware.total_memory_bytes() == 1073741824
    limit = "max\n"
    assert hardware.total_memory_bytes() == physical
    limit = f"{physical * 2}\n"
    assert hardware.total_memory_bytes() == physical


# ---------------------------------------------------------------- every branch's whole Precision


def strict_gpu(monkeypatch, bf16: bool) -> list:
    """fake_gpu whose queries must name the device, and whose bf16 check counts emulation as support (torch's
    default), so only the including_emulation=False query tells a pre-Ampere GPU apart."""
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: asked.append(device) or "Tesla V100")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16 or including_emulation)
    return asked


def test_gpu_precisions_are_whole_and_ask_about_the_runs_device(monkeypatch):
    asked = strict_gpu(monkeypatch, bf16=False)
    gpu = torch.device("cuda", 1)
    assert hardware.resolve_autocast("auto", gpu) == hardware.Precision(
        "auto", "float16", "Tesla V100 has no bf16 units (pre-Ampere): fp16 with loss scaling")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # fp16 is what such a GPU has: no warning
        assert hardware.resolve_autocast("float16", gpu) == hardware.Precision(
            "float16", "float16", "model.autocast = 'float16' as configured")
    assert asked == [gpu, gpu]
    strict_gpu(monkeypatch, bf16=True)
    assert hardware.resolve_autocast("auto", gpu) == hardware.Precision("auto", "bfloat16", "Tesla V100 computes bf16 natively")


def test_another_device_keeps_an_explicit_half_dtype():
    meta = torch.device("meta")
    assert hardware.resolve_autocast("bfloat16", meta) == hardware.Precision(
        "bfloat16", "bfloat16", "model.autocast = 'bfloat16' as configured")
    assert hardware.resolve_autocast("auto", meta).requested == "auto"


def test_cpu_choices_are_whole_measure_the_given_model_and_hold_at_their_thresholds(monkeypatch):
    model = object()  # the model's config: passed through to the probe as it is
    measured = []

    def half_speed(dtype, probe_model):
        measured.append((dtype, probe_model))
        return speedup, "probe"

    monkeypatch.setattr(hardware, "cpu_half_speed", half_speed)
    monkeypatch.setattr(hardware, "cpu_bf16_units", lambda: ["AVX512-BF16", "AMX-BF16"])
    speedup = hardware.BF16_SPEEDUP_NEEDED  # exactly the margin: bf16
    assert hardware.resolve_autocast("auto", CPU, model) == hardware.Precision(
        "auto", "bfloat16", "CPU AVX512-BF16/AMX-BF16: bf16 runs natively (probe)")
    speedup = 1.0
    assert hardware.resolve_autocast("auto", CPU, model).reason.startswith(
        "torch reports AVX512-BF16/AMX-BF16, but bf16 measured no faster than fp32 (probe;")
    speedup = 1 / hardware.BF16_SPEEDUP_NEEDED  # exactly the margin: slower, but not called emulated
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hardware.resolve_autocast("float16", CPU, model) == hardware.Precision(
            "float16", "float16", "model.autocast = 'float16' as configured (probe)")
    speedup = 0.1
    with pytest.warns(UserWarning, match=r"bf16 units reported: AVX512-BF16, AMX-BF16\)"):
        hardware.resolve_autocast("bfloat16", CPU, model)
    assert measured == [("bfloat16", model), ("bfloat16", model), ("float16", model), ("bfloat16", model)]


def test_resolve_precision_measures_on_the_runs_model(monkeypatch):
    seen = []
    monkeypatch.setattr(hardware, "resolve_autocast",
                        lambda requested, device, model_config=None: seen.append(model_config)
                        or hardware.Precision(requested, None, "x"))
    config = load_config(GRPOConfig)
    model_config = object()
    machine = hardware.resolve_precision(config, CPU, model_config)
    assert seen == [model_config] and config.model.autocast is None
    assert machine["attention_kernels"] == "torch's choice"  # a CPU keeps torch's kernels; machine.json says so
