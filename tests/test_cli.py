"""The `rlvr` dispatcher (rlvr_cli): each command reaches its own package, and only that package."""

import argparse
import json
import os
import subprocess
import sys

import pytest

from rlvr_cli import BROKEN_PIPE_EXIT, COMMAND_HELP, REGISTRARS, build_parser


@pytest.mark.parametrize("command", sorted(REGISTRARS))
def test_each_command_is_registered_by_the_package_it_dispatches_to(command, capsys):
    with pytest.raises(SystemExit) as exited:  # an unregistered command would be argparse's "invalid choice" (2)
        build_parser(command).parse_args([command, "--help"])
    assert exited.value.code == 0
    assert f"usage: rlvr {command}" in capsys.readouterr().out


def run_in_fresh_python(argv: list[str]) -> tuple[int, str, list[str]]:
    """main(argv) in a new interpreter: its exit code, what it printed, and the heavy modules it imported."""
    script = (
        "import json, sys\n"
        "from rlvr_cli import main\n"
        "try:\n"
        f"    code = main({argv!r})\n"
        "except SystemExit as exited:\n"
        "    code = exited.code\n"
        "loaded = [m for m in ('torch', 'transformers', 'algos', 'rlvr_env') if m in sys.modules]\n"
        "print(json.dumps({'code': code, 'loaded': loaded}))\n"
    )
    wide = {**os.environ, "COLUMNS": "200"}  # help lines unwrapped, whatever the terminal
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=wide)
    assert proc.returncode == 0, proc.stderr
    *printed, report = proc.stdout.strip().splitlines()
    return json.loads(report)["code"], "\n".join(printed), json.loads(report)["loaded"]


def test_verify_imports_neither_torch_nor_the_other_packages():
    code, _, loaded = run_in_fresh_python(["verify", "--pred", r"\boxed{2}", "--gold", "2"])
    assert (code, loaded) == (0, [])


def test_help_lists_each_command_with_its_help_and_imports_no_package():
    code, printed, loaded = run_in_fresh_python(["--help"])
    assert (code, loaded) == (0, [])
    listed = {line.split()[0]: " ".join(line.split()[1:]) for line in printed.splitlines() if line.startswith("    ")}
    assert listed == COMMAND_HELP and set(COMMAND_HELP) == set(REGISTRARS)


@pytest.mark.parametrize("command", sorted(REGISTRARS))
def test_the_listing_shows_the_help_the_package_registers(command):
    commands = next(a for a in build_parser(command)._actions if isinstance(a, argparse._SubParsersAction))
    assert {choice.dest: choice.help for choice in commands._choices_actions}[command] == COMMAND_HELP[command]


def test_python_m_rlvr_cli_lists_every_command():
    proc = subprocess.run([sys.executable, "-m", "rlvr_cli", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    assert all(command in proc.stdout for command in REGISTRARS)


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    """`rlvr envs --json | head -2` ended in a BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "rlvr_cli", "verify", "--pred", "1", "--gold", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # as `head` does once it has its lines: the command's output has nowhere to go
    _, stderr = proc.communicate(timeout=120)
    assert (proc.returncode, stderr) == (BROKEN_PIPE_EXIT, b"")


def test_version_and_a_short_readable_envs_listing(capsys, monkeypatch):
    from rlvr_cli import main

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.startswith("rlvr ")
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["envs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 100 for line in lines)  # were 300-character lines of every default
    assert any(line.startswith("rlvr/Countdown-v0") and "Reach a target" in line for line in lines)
    assert main(["envs", "--kwargs"]) == 0
    listing = capsys.readouterr().out
    assert "rlvr/Arithmetic-v0" in listing and "\n    digits = 2\n" in listing


def test_a_warning_is_one_line_in_the_command_s_output():
    """Python's default showed the warning's file, line number and source line after it. (In a process of its own:
    pytest records warnings instead of printing them.)"""
    code = ("import warnings; from rlvr_cli import _one_line_warning; warnings.formatwarning = _one_line_warning; "
            "warnings.warn('env.use_chat_template is true but the tokenizer has no chat template')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stderr == "rlvr: UserWarning: env.use_chat_template is true but the tokenizer has no chat template\n"
