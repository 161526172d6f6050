"""The package layering (pyproject.toml [tool.importlinter]): rlvr_cli > algos > rlvr_env > rewards, and inside algos
cli > algorithms > run > learn | rollout > model > system > config > core. lint-imports reads the import graph
statically, so this takes about a second. Below the algorithms no code reads an algorithm's config section."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
ALGORITHM_SECTIONS = {"grpo", "ppo", "dpo"}
BELOW_THE_ALGORITHMS = ["learn", "rollout", "model", "system", "run", "core", "config.py"]


@pytest.mark.skipif(not LINT_IMPORTS.exists(),
                    reason=f"{LINT_IMPORTS} is absent: import-linter (the dev extra) is not installed in this venv")
def test_import_contracts_are_kept():
    run = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"lint-imports exited {run.returncode}:\n{run.stdout}\n{run.stderr}"
    for contract in ("algos: cli > algorithms > run > learn | rollout > model > system > config > core",
                     "each algorithm stands alone", "rewards needs no torch"):
        assert contract in run.stdout, run.stdout  # checked (exit status 0: every contract checked was kept)


def section_reads(source: str) -> list[str]:
    """Each ``x.grpo`` / ``x.ppo`` / ``x.dpo`` attribute and ``getattr(x, "grpo")`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ALGORITHM_SECTIONS:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"getattr", "hasattr"}
              and any(isinstance(arg, ast.Constant) and arg.value in ALGORITHM_SECTIONS for arg in node.args)):
            found.append(f"line {node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return sorted(found)


def test_section_reads_are_found():
    assert section_reads("config.grpo.beta\ngetattr(config, 'ppo')\nconfig.rollout.group_size") == [
        "line 1: .grpo", "line 2: getattr(..., 'ppo')"]


def test_nothing_below_the_algorithms_reads_an_algorithms_section():
    """A shared module that read config.grpo would need a twin for every algorithm (the old max_episode_tokens did)."""
    package = REPO_ROOT / "algos"
    modules = [path for part in BELOW_THE_ALGORITHMS for path in ([package / part] if part.endswith(".py")
                                                                 else sorted((package / part).rglob("*.py")))]
    assert len(modules) > 30
    reads = {str(path.relative_to(REPO_ROOT)): found for path in modules if (found := section_reads(path.read_text()))}
    assert reads == {}
