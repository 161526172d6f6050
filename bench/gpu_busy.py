"""The share of a stretch of wall time a GPU is busy, from a torch.profiler trace: the union of its kernels' intervals
(bench/profile_step.py per phase of one step, bench/overlap.py over the steps of a run with rollouts beside training)."""

from __future__ import annotations

from collections.abc import Iterable

from torch.autograd import DeviceType


def busy_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (microseconds in, seconds out): kernels on several streams
    overlap, and the GPU is busy once for them."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1e6


def kernel_intervals(events, ranges: Iterable[str] = ()) -> list[tuple[float, float]]:
    """[start, end) in microseconds of each GPU event of a profiler's ``events()``, less the named record_function
    ``ranges`` (the profiler mirrors them onto the GPU's timeline)."""
    ranges = set(ranges)
    return [(e.time_range.start, e.time_range.end) for e in events
            if e.device_type == DeviceType.CUDA and e.name not in ranges]


def busy_in(kernels: list[tuple[float, float]], first: float, last: float) -> float:
    """Seconds of [first, last) (microseconds) in which at least one of ``kernels`` runs."""
    return busy_seconds((max(a, first), min(b, last)) for a, b in kernels if b > first and a < last)


def host_range(events, name: str) -> tuple[float, float]:
    """[start, end) in microseconds of the record_function range ``name`` as the host ran it (not its mirror on the
    GPU's timeline, which spans only that range's kernels)."""
    return next((e.time_range.start, e.time_range.end) for e in events if e.name == name and e.device_type == DeviceType.CPU)
