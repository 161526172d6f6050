"""Run candidate code against tests in a sandboxed process: a code verifier with hard limits.

    from rewards.code import code_verifier, run_code
    run_code("def add(a, b):\\n    return a + b", ["assert add(1, 2) == 3"])   # CodeRun(status='ok', passed=1, total=1, ...)
    code_verifier("```python\\ndef add(a, b): return a + b\\n```", answer=["assert add(1, 2) == 3"])  # VerifyResult(1.0, 'ok')

Every run is a fresh ``python -I -S`` process (``rewards/code_runner.py``) in its own session with a
throwaway working directory, stdout/stderr to a size-capped file, and rlimits on CPU time, address
space, file size and processes; a wall-clock deadline kills its whole process group. Where Linux
allows it (root, or unprivileged user namespaces), the process also gets fresh user, pid and network
namespaces: no network interface, no other process visible, and everything it started dies with it.
An audit hook in the child refuses signals to other processes, new processes, sockets, ctypes and
writes outside the working directory. What this does not guarantee is in docs/rewards.md.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .result import ERROR, NO_ANSWER, OK, TIMEOUT, VerifyResult

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "code_runner.py")
# Fresh user (so that it works without root), pid and network namespaces; --kill-child ends the pid
# namespace, and with it every process in it, when unshare itself is killed.
NAMESPACES = ("--user", "--map-root-user", "--pid", "--fork", "--kill-child", "--net")
MAX_CODE_CHARS = 100_000
MAX_TESTS = 500
MAX_REPORT_BYTES = 1 << 20
_FENCED = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class CodeLimits:
    """Hard limits of one run. ``timeout_s``: wall clock, after which the process group is killed;
    ``cpu_s``: CPU seconds (RLIMIT_CPU); ``memory_mb``: address space (RLIMIT_AS, so MemoryError past
    it); ``file_mb``: largest file it may write, its output included (RLIMIT_FSIZE); ``processes``:
    RLIMIT_NPROC, which Linux counts per user and does not apply to root; ``output_chars``: how much
    of its stdout/stderr comes back; ``isolate``: use namespaces where the machine allows them."""

    timeout_s: float = 4.0
    cpu_s: int = 3
    memory_mb: int = 512
    file_mb: int = 1
    processes: int = 16
    output_chars: int = 4000
    isolate: bool = True

    def __post_init__(self) -> None:
        if not (isinstance(self.timeout_s, (int, float)) and math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {self.timeout_s!r}")
        for name in ("cpu_s", "memory_mb", "file_mb", "processes", "output_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.isolate, bool):
            raise ValueError(f"isolate must be true or false, got {self.isolate!r}")


@dataclass(frozen=True)
class CodeRun:
    """What one run did. ``status``: ok (the program and its tests ran to the end, within the limits,
    nothing refused), timeout (wall clock or CPU limit), error (a refused operation, the memory limit,
    the process ended the run itself or died, or the sandbox failed); ``reason`` says which.
    ``score`` is the fraction of tests passed when ok, else 0."""

    status: str
    passed: int = 0
    total: int = 0
    output: str = ""
    reason: str = ""
    test_errors: tuple[str, ...] = ()
    violations: tuple[str, ...] = ()
    isolation: str = "rlimits"

    @property
    def score(self) -> float:
        return self.passed / self.total if self.status == OK and self.total else 0.0

    def details(self) -> dict[str, Any]:
        details = {"passed": self.passed, "total": self.total, "isolation": self.isolation}
        if self.reason:
            details["reason"] = self.reason
        if self.test_errors:
            details["test_errors"] = list(self.test_errors[:10])
        if self.violations:
            details["violations"] = list(self.violations)
        return details


@functools.cache
def namespace_command() -> tuple[str, ...]:
    """The ``unshare`` prefix that isolates a run, or () where this machine refuses it (probed once)."""
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return ()
    try:
        probe = subprocess.run([unshare, *NAMESPACES, "--", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ()
    return (unshare, *NAMESPACES, "--") if probe.returncode == 0 else ()


def extract_code(completion: str) -> str | None:
    """The last fenced code block (```python, ```py or bare ```) of a completion, or None."""
    blocks = _FENCED.findall(completion)
    return blocks[-1] if blocks else None


def run_code(code: str, tests: Sequence[str] = (), *, setup: str = "", limits: CodeLimits = CodeLimits()) -> CodeRun:
    """Run ``setup + code``, then each test statement (``assert f(1) == 2``) in its namespace, in a fresh
    sandboxed process; never raises on what the code does. Safe from threads, asyncio
    (``await asyncio.to_thread(run_code, ...)``) and worker processes."""
    if len(code) > MAX_CODE_CHARS or len(tests) > MAX_TESTS:
        return CodeRun(ERROR, total=len(tests), reason=f"over {MAX_CODE_CHARS} characters of code or {MAX_TESTS} tests")
    prefix = namespace_command() if limits.isolate else ()
    spec = {
        "code": code, "setup": setup, "tests": list(tests),
        "limits": {
            "cpu_s": limits.cpu_s, "memory_bytes": limits.memory_mb << 20, "file_bytes": limits.file_mb << 20,
            "processes": limits.processes, "init_deadline_s": limits.timeout_s + 1.0,
        },
    }
    with tempfile.TemporaryDirectory(prefix="rlvr-code-") as root:
        workdir = os.path.join(root, "work")  # the program's cwd; its output file lies outside it
        os.mkdir(workdir)
        output_path = os.path.join(root, "output")
        read_fd, write_fd = os.pipe()
        spec["report_fd"] = write_fd
        try:
            with open(output_path, "wb") as output:
                process = subprocess.Popen(
                    [*prefix, sys.executable, "-I", "-S", RUNNER],
                    stdin=subprocess.PIPE, stdout=output, stderr=subprocess.STDOUT, cwd=workdir,
                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"},
                    pass_fds=(write_fd,), start_new_session=True,
                )
        except OSError as exc:
            os.close(read_fd)
            return CodeRun(ERROR, total=len(tests), reason=f"could not start the sandbox: {exc}")
        finally:
            os.close(write_fd)
        try:
            lines, timed_out = _collect(process, read_fd, json.dumps(spec).encode(), limits.timeout_s)
        finally:
            os.close(read_fd)
            _kill_group(process)
        with open(output_path, "rb") as output:
            text = output.read(limits.output_chars * 4).decode("utf-8", errors="replace")[: limits.output_chars]
    isolation = "namespaces" if prefix else "rlimits"
    return _outcome(lines, len(tests), process.returncode, timed_out, limits, text, isolation)


def _collect(process: subprocess.Popen, read_fd: int, spec: bytes, timeout_s: float) -> tuple[list[dict], bool]:
    """Send the spec, then read report lines until "done", the pipe's end, or the deadline (-> timed out)."""
    deadline = time.monotonic() + timeout_s
    try:
        process.stdin.write(spec)
        process.stdin.close()
    except OSError:  # the runner died before reading its spec; its exit status says the rest
        pass
    buffer = b""
    while b'{"done": true}' not in buffer:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return _parse(buffer), True
        if not select.select([read_fd], [], [], remaining)[0]:
            continue
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        if len(buffer) < MAX_REPORT_BYTES:
            buffer += chunk
    return _parse(buffer), False


def _parse(buffer: bytes) -> list[dict]:
    lines = []
    for raw in buffer.splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue  # a line cut by a kill, or bytes the program wrote into the pipe itself
        if isinstance(line, dict):
            lines.append(line)
    return lines


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the run's whole process group (with namespaces: unshare, and so the pid namespace), then reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def _outcome(lines: list[dict], total: int, returncode: int, timed_out: bool, limits: CodeLimits,
             output: str, isolation: str) -> CodeRun:
    passed_by_test = {line["test"]: line for line in lines if isinstance(line.get("test"), int)}
    passed = sum(1 for index, line in passed_by_test.items() if 0 <= index < total and line.get("passed") is True)
    errors = [f"test {i}: {line.get('error')}" for i, line in sorted(passed_by_test.items()) if line.get("passed") is not True]
    code_errors = [str(line["code_error"]) for line in lines if "code_error" in line]
    violations = tuple(sorted({str(line["violation"]) for line in lines if "violation" in line}))
    done = any(line.get("done") is True for line in lines)
    cpu_killed = returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU)
    if timed_out or cpu_killed:
        status, reason = TIMEOUT, (f"over {limits.cpu_s} s of CPU" if cpu_killed else f"over {limits.timeout_s} s")
    elif violations:
        status, reason = ERROR, "refused: " + ", ".join(violations)
    elif not done:
        status, reason = ERROR, f"the program ended the run (exit status {returncode})"
    elif any(str(line.get("error") or line.get("code_error")).startswith("MemoryError") for line in lines):
        status, reason = ERROR, f"over the memory limit ({limits.memory_mb} MB)"
    else:
        status, reason = OK, (code_errors[0] if code_errors else "")
    return CodeRun(status, passed, total, output, reason, tuple(code_errors + errors), violations, isolation)


@dataclass(frozen=True)
class CodeVerifier:
    """Scores a completion's last fenced code block by the fraction of the gold tests it passes.

    ``answer``: the test statements, or ``{"tests": [...], "setup": "..."}`` (MBPP's test_setup_code).
    Status no_answer when the completion has no code block; otherwise the run's status (see CodeRun).
    ``details["components"]["correct"]`` is the score, so all tests passed is what counts as solved."""

    limits: CodeLimits = field(default_factory=CodeLimits)

    def __call__(self, completion: str, *, answer: Any, **info: Any) -> VerifyResult:
        tests, setup = (answer.get("tests", ()), answer.get("setup", "")) if isinstance(answer, Mapping) else (answer, "")
        if isinstance(tests, str) or not all(isinstance(t, str) for t in tests) or not isinstance(setup, str):
            raise ValueError(f"code tests must be a list of statements (with an optional setup string), got {answer!r}")
        code = extract_code(completion) if isinstance(completion, str) else None
        if code is None:
            return VerifyResult(0.0, NO_ANSWER, {"components": {"correct": 0.0}, "reason": "no fenced code block"})
        run = run_code(code, list(tests), setup=setup, limits=self.limits)
        return VerifyResult(run.score, run.status, {**run.details(), "components": {"correct": run.score}})


code_verifier = CodeVerifier()
