"""The `rlvr` dispatcher (rlvr_cli): each command reaches its own package, and only that package."""

import argparse
import json
import subprocess
import sys

import pytest

from rlvr_cli import REGISTRARS, build_parser


@pytest.mark.parametrize("command", sorted(REGISTRARS))
def test_each_command_is_registered_by_the_package_it_dispatches_to(command):
    subparsers = next(a for a in build_parser(command)._actions if isinstance(a, argparse._SubParsersAction))
    assert command in subparsers.choices


def test_verify_imports_neither_torch_nor_the_other_packages():
    script = (
        "import json, sys\n"
        "from rlvr_cli import main\n"
        "code = main(['verify', '--pred', r'\\boxed{2}', '--gold', '2'])\n"
        "loaded = [m for m in ('torch', 'transformers', 'algos', 'rlvr_env') if m in sys.modules]\n"
        "print(json.dumps({'code': code, 'loaded': loaded}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"code": 0, "loaded": []}


def test_python_m_rlvr_cli_lists_every_command():
    proc = subprocess.run([sys.executable, "-m", "rlvr_cli", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    assert all(command in proc.stdout for command in REGISTRARS)
