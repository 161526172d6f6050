"""What the machine computes with, detected rather than assumed: its CPU's and GPU's bf16 support,
threads and memory (describe_machine), and the precision a run's matmuls use (resolve_autocast).

A CPU without AVX512-BF16 or AMX emulates bf16: there a bf16 matmul is tens of times slower than an
fp32 one (64x576 @ 576x1536 on an AVX2 EPYC: 1.55 ms fp32, 106 ms bf16), so a precision tuned on one
machine can stall another. model.autocast = "auto" picks from what torch reports and a matmul
measured on the model's own shapes.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import torch

log = logging.getLogger("rlvr")

# bf16 must beat fp32 by this factor on the probe to be chosen: a native unit is ~2x faster, an emulated one
# 10-70x slower, so the margin keeps timing noise from flipping the choice on a machine between the two.
BF16_SPEEDUP_NEEDED = 1.25


@dataclass(frozen=True)
class Precision:
    requested: str | None  # model.autocast as configured ("auto", "bfloat16", "float16" or None)
    autocast: str | None  # what the run uses: "bfloat16", "float16" or None (fp32 matmuls)
    reason: str  # why, in words: the log line and machine.json


def cpu_capabilities() -> dict[str, Any]:
    """What torch reports of this CPU (its name, ISA extensions, cores); empty on a torch without the query."""
    return torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}


def cpu_bf16_units() -> list[str]:
    """The bf16 matmul units torch reports on this CPU: "AVX512-BF16", "AMX-BF16" (empty: bf16 is emulated)."""
    capabilities = cpu_capabilities()
    return [name for key, name in (("avx512_bf16", "AVX512-BF16"), ("amx_bf16", "AMX-BF16")) if capabilities.get(key)]


def probe_shape(model_config: Any | None) -> tuple[int, int, int]:
    """(rows, hidden, intermediate): a 64-token slice through the MLP up-projection of a model of this transformers
    config (its text model's), its commonest matmul."""
    config = model_config.get_text_config() if model_config is not None else None
    hidden = getattr(config, "hidden_size", None) or 576
    return 64, hidden, getattr(config, "intermediate_size", None) or 4 * hidden


@functools.cache
def cpu_matmul_ms(dtype: str, rows: int, inner: int, cols: int) -> float:
    """Fastest of up to 50 CPU (rows x inner) @ (inner x cols) matmuls in ``dtype`` within half a second, in
    milliseconds, at torch's thread count: other processes only ever slow a rep down (a busy machine once measured a
    native bf16 matmul 8 ms by the median, and with two other 2-thread jobs on 2 cores, 15.95 ms as the fastest of 5
    against 0.28 ms quiet: a rep whose threads were not all scheduled waits for them), so the minimum of many reps
    is what the hardware does."""
    own = torch.Generator().manual_seed(0)  # the run's seeded global RNG must not move (a resume replays it)
    a = torch.randn(rows, inner, generator=own).to(getattr(torch, dtype))
    b = torch.randn(inner, cols, generator=own).to(getattr(torch, dtype))
    a @ b  # the first call picks and JIT-compiles oneDNN's kernel
    times = []
    deadline = time.perf_counter() + 0.5  # an emulated bf16 matmul can take ~0.1 s: bound the probe, not the reps
    while len(times) < 50 and (len(times) < 2 or time.perf_counter() < deadline):
        started = time.perf_counter()
        a @ b
        times.append((time.perf_counter() - started) * 1e3)
    return min(times)


def cpu_half_speed(dtype: str, model_config: Any | None) -> tuple[float, str]:
    """(fp32 time / ``dtype`` time, the measurement in words) for a matmul of the model's own shape on this CPU."""
    shape = probe_shape(model_config)
    half, full = cpu_matmul_ms(dtype, *shape), cpu_matmul_ms("float32", *shape)
    rows, inner, cols = shape
    return full / half, f"{rows}x{inner} @ {inner}x{cols}: {half:.2f} ms {dtype} vs {full:.2f} ms float32"


def resolve_autocast(requested: str | None, device: torch.device, model_config: Any | None = None) -> Precision:
    """The autocast dtype a run uses on ``device`` for model.autocast = ``requested``.

    "auto": bf16 where the device computes it natively (a CUDA GPU with bf16, i.e. Ampere or newer; a CPU
    with AVX512-BF16 or AMX whose bf16 matmul measures faster than fp32), fp16 with loss scaling on a GPU
    without bf16, fp32 elsewhere. An explicit half dtype is kept, with one warning where it is emulated. A CPU
    measures on the shape of the model ``model_config`` (a transformers config) describes: probe_shape.
    """
    if requested is None:
        return Precision(None, None, "model.autocast = null: fp32 matmuls")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        if requested == "auto":
            if native:
                return Precision(requested, "bfloat16", f"{name} computes bf16 natively")
            return Precision(requested, "float16", f"{name} has no bf16 units (pre-Ampere): fp16 with loss scaling")
        if requested == "bfloat16" and not native:
            warn_emulated(f"model.autocast = 'bfloat16', but {name} has no bf16 units (pre-Ampere) and emulates it; "
                          "use model.autocast = 'auto' (fp16 with loss scaling there)")
        return Precision(requested, requested, f"model.autocast = {requested!r} as configured")
    if device.type != "cpu":
        if requested == "auto":
            return Precision(requested, None, f"no bf16 detection for {device.type} devices: fp32 matmuls")
        return Precision(requested, requested, f"model.autocast = {requested!r} as configured")

    units = cpu_bf16_units()
    if requested == "auto":
        speedup, measured = cpu_half_speed("bfloat16", model_config)
        if not units:
            return Precision(requested, None, f"this CPU has neither AVX512-BF16 nor AMX, so bf16 is emulated "
                                              f"({measured}): fp32 matmuls")
        if speedup >= BF16_SPEEDUP_NEEDED:
            return Precision(requested, "bfloat16", f"CPU {'/'.join(units)}: bf16 runs natively ({measured})")
        return Precision(requested, None, f"torch reports {'/'.join(units)}, but bf16 measured no faster than fp32 "
                                          f"({measured}; oneDNN may be capped, e.g. ONEDNN_MAX_CPU_ISA): fp32 matmuls")
    speedup, measured = cpu_half_speed(requested, model_config)
    if speedup < 1 / BF16_SPEEDUP_NEEDED:
        warn_emulated(f"model.autocast = {requested!r} is {1 / speedup:.0f}x slower than fp32 on this CPU ({measured}; "
                      f"bf16 units reported: {', '.join(units) or 'none'}): use model.autocast = 'auto' or null")
    return Precision(requested, requested, f"model.autocast = {requested!r} as configured ({measured})")


@functools.cache
def warn_emulated(message: str) -> None:
    """Warn once per message: an emulated half precision makes every step slow, one warning says so."""
    warnings.warn(message, stacklevel=3)


def total_memory_bytes() -> int | None:
    """Physical memory, or the cgroup's limit when a container sets a lower one."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    try:
        with open("/sys/fs/cgroup/memory.max") as limit:
            text = limit.read().strip()
        if text.isdigit():
            memory = min(memory, int(text))
    except OSError:
        pass
    return memory


def describe_machine(device: torch.device) -> dict[str, Any]:
    """What a run's numbers depend on: CPU model and capability, bf16 units, threads, memory, and the GPU if used."""
    memory = total_memory_bytes()
    machine = {
        "cpu": cpu_capabilities().get("cpu_name") or platform.processor() or platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the widest vector ISA torch's kernels use
        "cpu_bf16_units": cpu_bf16_units(),
        "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": round(memory / 1024**3, 1) if memory else None,
        "torch": torch.__version__,
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        machine.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 1024**3, 1),
                       gpu_compute_capability=f"{props.major}.{props.minor}")
    return machine


def _setting(value: str | None) -> str:
    return "null" if value is None else value


def machine_line(machine: dict[str, Any], precision: Precision) -> str:
    """One log line: where the run computes and in what precision, and why."""
    where = machine.get("gpu") or (f"{machine['cpu']} ({machine['cpu_capability']}"
                                   f"{', ' + '/'.join(machine['cpu_bf16_units']) if machine['cpu_bf16_units'] else ''})")
    return (f"device {machine['device']}: {where}, {machine['torch_threads']} torch threads of {machine['cpu_cores']} "
            f"cores, {machine['memory_gib']} GiB memory; autocast {_setting(precision.requested)} -> "
            f"{precision.autocast or 'off'} "
            f"({precision.reason})")


def choose_attention_kernels(device: torch.device) -> str:
    """Which kernels scaled_dot_product_attention may use on ``device``, chosen rather than inherited; returns it for
    the log. On CUDA: flash and memory-efficient (math as the last resort), never cuDNN, which torch >= 2.11 prefers
    on Hopper under a mask: it builds an execution plan per exact shape (a decode's mask grows every token: an H200
    rollout spent 2.3 s of CPU in it for 18 ms of GPU time), and PyTorch's open issues report wrong greedy output with
    fewer than 8 KV heads and NaN gradients under a mask on it. Process-wide, as torch's own switch is."""
    if device.type != "cuda":
        return "torch's choice"
    torch.backends.cuda.enable_cudnn_sdp(False)
    return "flash / memory-efficient (cuDNN off)"


def resolve_precision(config: Any, device: torch.device, model_config: Any | None = None) -> dict[str, Any]:
    """Resolve config.model.autocast in place (so config.yaml records what ran), choose the attention kernels, log
    the machine and the choices, and return them for the run directory's machine.json."""
    precision = resolve_autocast(config.model.autocast, device, model_config)
    config.model.autocast = precision.autocast
    machine = describe_machine(device)
    attention = choose_attention_kernels(device)
    log.info(f"{machine_line(machine, precision)}; attention kernels: {attention}")
    return {"machine": machine, "precision": asdict(precision), "attention_kernels": attention}
