"""release_free_memory (algos/system/runtime.py): freed CPU tensors go back to the OS. Apart from algos/system/memory.py's tests,
whose mutation runs it would stop: there glibc hands the freed pages back by itself."""

from __future__ import annotations

import pytest

FRAGMENTED_HEAP = """
import torch
from algos.system import runtime
from algos.system.memory import rss_gb
# 16 MB, more than the heap has free after the imports, so mmapped: freeing it raises glibc's mmap threshold to
# 16 MB, and the 1 MB tensors below go on the heap (1 MB ones could come from heap space the imports freed)
warm = torch.ones(4 * 1024 * 1024)
del warm
freed, kept = [], []
for _ in range(300):  # 300 MB on the heap, each MB followed by a 256 KB tensor that stays: holes, not a free top (a
    # smaller one could land in a hole the imports left)
    freed.append(torch.ones(256 * 1024))
    kept.append(torch.ones(64 * 1024))
held = rss_gb()
del freed
kept_after_free = held - rss_gb()
runtime.release_free_memory()
print(kept_after_free, held - rss_gb())
"""


def test_freed_cpu_tensors_go_back_to_the_os():
    """glibc keeps freed heap pages in the process; release_free_memory (after a rollout and after each optimizer
    step) hands them back, so one phase's activations do not stay in the next phase's RSS. In a fresh process:
    this one's heap holds the other tests' holes."""
    import subprocess
    import sys

    from algos.system import runtime

    if runtime._malloc_trim() is None:
        pytest.skip("the C library is not glibc")
    out = subprocess.run([sys.executable, "-c", FRAGMENTED_HEAP], capture_output=True, text=True, check=True)
    returned_by_free, returned_by_trim = map(float, out.stdout.split())
    assert returned_by_free < 0.05  # glibc keeps the holes
    assert returned_by_trim > 0.2  # of the 0.29 GB freed
