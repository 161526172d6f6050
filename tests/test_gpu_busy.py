"""bench/gpu_busy.py: the GPU's busy share from a profiler's events (what bench/profile_step.py and bench/overlap.py
report on a GPU), checked on hand-built events, since no GPU runs here."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # bench scripts import their sibling gpu_busy as run from bench/
    return SimpleNamespace(gpu_busy=importlib.import_module("gpu_busy"), overlap=importlib.import_module("overlap"))


def event(name: str, start: float, end: float, device=DeviceType.CUDA):
    return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end))


def test_busy_seconds_counts_overlapping_kernels_once(bench):
    # [0, 10) and [5, 20) on two streams overlap in [5, 10): busy 20 us; [30, 40) after a gap: 10 more; [32, 35) inside it
    assert bench.gpu_busy.busy_seconds([(30, 40), (0, 10), (5, 20), (32, 35)]) == pytest.approx(30e-6)
    assert bench.gpu_busy.busy_seconds([]) == 0.0


def test_busy_in_clips_kernels_to_the_window(bench):
    kernels = [(0, 10), (15, 25), (40, 50)]
    # the window [5, 20): 5 us of the first kernel, 5 of the second; the third lies outside
    assert bench.gpu_busy.busy_in(kernels, 5, 20) == pytest.approx(10e-6)


def test_kernel_intervals_keep_the_gpus_events_less_the_mirrored_ranges(bench):
    events = [event("gemm", 0, 4), event("collect", 0, 9), event("aten::mm", 1, 2, DeviceType.CPU), event("copy", 6, 7)]
    assert bench.gpu_busy.kernel_intervals(events, ["collect"]) == [(0, 4), (6, 7)]


def test_overlap_reports_the_share_of_its_measured_steps_the_gpu_ran_a_kernel(bench):
    measured = bench.overlap.MEASURED
    # the measured range [100, 300) us; kernels busy in [90, 150) (50 us inside) and [200, 230) and [220, 260) (60 us)
    # (the range's mirror on the GPU's timeline, listed first, spans only its kernels: [200, 260))
    events = [event(measured, 200, 260), event(measured, 100, 300, DeviceType.CPU), event("k1", 90, 150),
              event("k2", 200, 230), event("k3", 220, 260), event("k4", 400, 500)]
    assert bench.overlap.gpu_busy_share(events) == pytest.approx(110 / 200)
