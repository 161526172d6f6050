"""The `rlvr` dispatcher (rlvr_cli): each command reaches its own package, and only that package."""

import json
import subprocess
import sys

import pytest

from rlvr_cli import REGISTRARS, build_parser


@pytest.mark.parametrize("command", sorted(REGISTRARS))
def test_each_command_is_registered_by_the_package_it_dispatches_to(command, capsys):
    with pytest.raises(SystemExit) as exited:  # an unregistered command would be argparse's "invalid choice" (2)
        build_parser(command).parse_args([command, "--help"])
    assert exited.value.code == 0
    assert f"usage: rlvr {command}" in capsys.readouterr().out


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
