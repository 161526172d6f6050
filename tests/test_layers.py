"""The package layering (pyproject.toml [tool.importlinter]): rlvr_cli > algos > rlvr_env > rewards, and inside algos
the algorithms > learn > core. lint-imports reads the import graph statically, so this takes about a second."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


@pytest.mark.skipif(not LINT_IMPORTS.exists(),
                    reason=f"{LINT_IMPORTS} is absent: import-linter (the dev extra) is not installed in this venv")
def test_import_contracts_are_kept():
    run = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"lint-imports exited {run.returncode}:\n{run.stdout}\n{run.stderr}"
