"""Hooks for the whole suite."""

from __future__ import annotations

# The files that take longest, longest first: torchrun launches, the learning runs, the bench's and examples' end-to-end
# calls. Their worker-seconds under `make test` on a 2-core Intel Xeon with AMX (2026-12-02): 153, 110, 77, 50, 31, 28;
# a 2-core AMD EPYC (AVX2) took 1.5-3x as long.
LONG_FILES = ("test_distributed.py", "test_split_rollouts.py", "test_multiturn_learning.py", "test_bench.py",
              "test_grpo_learning.py", "test_examples.py")


def pytest_collection_modifyitems(config, items):
    """Run the long files first, each file's tests in their order. `make test` hands whole files to the workers in
    this order (pytest-xdist's loadfile, --no-loadscope-reorder), so the long ones start early and the workers finish
    together: in collection order one worker sat idle for two minutes while the other ran test_multiturn_learning."""
    rank = {name: position for position, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))


def pytest_runtest_setup(item):
    """Start every test with the LaTeX parser's caches empty, so that a test computes what it checks. mutmut depends
    on it twice: it picks each function's tests by which of them call it, and a cached parse (warmed by an earlier
    test) calls nothing; and it runs each mutant in a process forked from one that already ran the tests, whose
    caches would answer from the unmutated parser (170 of its first 191 mutants survived so). The probes cached
    elsewhere (isolation, matmul speed) stay: they measure the machine, and refilling them would cost seconds."""
    from rewards.latex import normalize, parse_answer

    normalize.cache_clear()
    parse_answer.cache_clear()
