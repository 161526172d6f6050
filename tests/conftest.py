"""Hooks for the whole suite."""

from __future__ import annotations

# The files that take longest, longest first (worker-seconds on the 2-core Intel Xeon, `make test`, 2026-11-29):
# torchrun launches, the learning runs, the bench's and examples' end-to-end calls.
# Their seconds under `make test` on an Intel Xeon with AMX (2 cores, 2026-12-02): 153, 110, 77, 50, 31, 28; a 2-core
# AMD EPYC (AVX2) took 1.5-3x as long.
LONG_FILES = ("test_distributed.py", "test_split_rollouts.py", "test_multiturn_learning.py", "test_bench.py",
              "test_grpo_learning.py", "test_examples.py")


def pytest_collection_modifyitems(config, items):
    """Run the long files first, each file's tests in their order. `make test` hands whole files to the workers in
    this order (pytest-xdist's loadfile, --no-loadscope-reorder), so the long ones start early and the workers finish
    together: in collection order one worker sat idle for two minutes while the other ran test_multiturn_learning."""
    rank = {name: position for position, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))
