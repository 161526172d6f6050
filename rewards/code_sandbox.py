"""Where model-written code runs: a bubblewrap sandbox that can read and write nothing of ours.

One run = one fresh ``python -I -S -c <rewards/code_runner.py>`` inside ``bwrap`` with:

- a new root: ``/usr`` (and the interpreter's own prefix) read-only, with every site-packages
  folder hidden; a private tmpfs of ``disk_mb`` as the working directory (``/tmp``); a fresh
  ``/proc`` and a minimal ``/dev``; no project, no dataset, no home, no ``/etc``;
- new user (uid 65534, all capabilities dropped, no nested user namespaces), pid, network (no
  interface but a down loopback), IPC, UTS and cgroup namespaces; ``--die-with-parent`` and
  ``--new-session``: when the run ends, its pid namespace and every process in it end too;
- rlimits set by the runner (CPU, address space, file size, processes, no core) and, where this
  machine lets us make cgroups (``rewards.run_cgroup``), caps on the processes and threads and on the
  memory of the whole run, which it enters before anything of it forks;
- a wall-clock deadline, after which the run's process group (and cgroup) is SIGKILLed.

Without ``bwrap`` on PATH, runs fall back to ``unshare``'s user, pid and network namespaces (no
mount namespace: the program can read and, as far as the kernel lets its uid, write the machine's
files), and without those to rlimits only; either fallback warns once, naming the risk.
"""

from __future__ import annotations

import functools
import json
import os
import select
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from .run_cgroup import ENTRY_FAILED, RunCgroup

RUNNER_SOURCE = (Path(__file__).with_name("code_runner.py")).read_text(encoding="utf-8")
MAX_REPORT_BYTES = 1 << 20
SANDBOX_UID = 65534  # "nobody" inside the user namespace
WORKDIR = "/tmp"  # the program's cwd inside bubblewrap: a private tmpfs
EXIT_GRACE_S = 1.0  # for a run whose channel closed to exit by itself before it is killed
CGROUP_EXTRA_PIDS = 3  # bwrap's two processes and the interpreter, besides the program's own
# Fresh user, pid and network namespaces (the fallback without bubblewrap); --kill-child ends the pid
# namespace, and with it every process in it, when unshare itself is killed.
NAMESPACES = ("--user", "--pid", "--fork", "--kill-child", "--net")
BUBBLEWRAP = "bubblewrap"
NAMESPACES_ONLY = "namespaces"
RLIMITS_ONLY = "rlimits"
RISK = {
    NAMESPACES_ONLY: "bwrap (Debian's bubblewrap) is not installed: model-written code runs in user/pid/network "
                     "namespaces only, and can read this machine's files and write what its uid may write "
                     "(install bubblewrap: `make setup` does where it can)",
    RLIMITS_ONLY: "neither bwrap nor unprivileged namespaces are available: model-written code runs with rlimits "
                  "only, and can read and write what this user can and signal this user's processes",
}


@dataclass(frozen=True)
class SandboxRun:
    """What one sandboxed process reported: its JSON lines, how many answers it wrote before it was
    sent the calls (forged ones), whether the deadline killed it, its exit status, the first
    ``output_chars`` of its stdout/stderr, the isolation it ran under, and whether the kernel killed
    a process of it at the run's memory cap."""

    lines: list[dict]
    unasked: int
    timed_out: bool
    returncode: int
    output: str
    isolation: str
    over_memory: bool = False


def _probe(command: list[str]) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@functools.cache
def available_isolation() -> str:
    """The strongest isolation this machine gives (probed once): bubblewrap, namespaces or rlimits.
    Anything short of bubblewrap warns once, naming the risk."""
    isolation = RLIMITS_ONLY
    if sys.platform.startswith("linux"):
        if shutil.which("bwrap") and _probe([*_bwrap_prefix(64), "true"]):
            isolation = BUBBLEWRAP
        elif shutil.which("unshare") and _probe(["unshare", *NAMESPACES, "--", "true"]):
            isolation = NAMESPACES_ONLY
    if isolation != BUBBLEWRAP:
        warnings.warn(f"rewards.code sandbox: {RISK[isolation]}", RuntimeWarning, stacklevel=2)
    return isolation


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _readonly_roots() -> list[str]:
    """Folders the interpreter needs: /usr, and the prefixes of this Python where they lie elsewhere."""
    roots = ["/usr"]
    for path in {os.path.realpath(sys.base_prefix), os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}:
        if not any(_within(path, root) for root in roots):
            roots.append(path)
    return roots


def _hidden_paths(roots: list[str]) -> list[str]:
    """Installed packages (this project, its data, anything pip put there) under the read-only roots."""
    candidates = set(site.getsitepackages()) | {site.getusersitepackages(), sysconfig.get_paths()["purelib"],
                                                 sysconfig.get_paths()["platlib"], "/usr/lib/python3/dist-packages",
                                                 "/usr/local/lib/python3/dist-packages"}
    candidates |= {str(p) for root in roots for p in Path(root).glob("lib/python3*/site-packages")}
    project = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    hidden = []
    for path in sorted({os.path.realpath(p) for p in candidates} | {project}):
        if os.path.isdir(path) and any(_within(path, root) and path != root for root in roots):
            hidden.append(path)
    return hidden


@functools.cache
def _bwrap_prefix(disk_mb: int) -> tuple[str, ...]:
    roots = _readonly_roots()
    command = ["bwrap", "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
               "--unshare-cgroup-try", "--disable-userns", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
               "--hostname", "sandbox", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    for root in roots:
        command += ["--ro-bind", root, root]
    for link in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(link):
            command += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            command += ["--ro-bind", link, link]
    for path in _hidden_paths(roots):
        command += ["--tmpfs", path, "--remount-ro", path]
    command += ["--proc", "/proc", "--dev", "/dev", "--size", str(disk_mb << 20), "--tmpfs", WORKDIR,
                "--chdir", WORKDIR, "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LC_ALL", "C.UTF-8",
                "--"]
    return tuple(command)


def remove_tree(path: str) -> str:
    """Delete ``path`` whatever the program left there (a 3,000-deep tree, unreadable folders); never
    raises. Returns what could not be removed, "" when all went."""
    try:
        shutil.rmtree(path)
    except (OSError, RecursionError):  # past ~1,000 levels shutil recurses out of the stack: rm does not
        pass
    if os.path.lexists(path):
        subprocess.run(["chmod", "-R", "u+rwx", path], capture_output=True)
        subprocess.run(["rm", "-rf", "--one-file-system", path], capture_output=True)
    return f"could not remove {path}" if os.path.lexists(path) else ""


def run_sandboxed(spec: dict, calls: list, *, timeout_s: float, disk_mb: int, processes: int, memory_bytes: int,
                  output_chars: int, isolate: bool) -> SandboxRun:
    """Run the runner on ``spec`` (the report fd is added here), send it ``calls`` once the program has
    run, and collect its report lines until "done", the channel's end or ``timeout_s``. Never raises
    on what the program does; OSError only when the sandbox itself cannot start. ``processes`` and
    ``memory_bytes`` cap the whole run where cgroups can be made (its tmpfs included in the memory)."""
    isolation = available_isolation() if isolate else RLIMITS_ONLY
    root = tempfile.mkdtemp(prefix="rlvr-code-")
    try:
        return _run_in(root, spec, calls, isolation, timeout_s, disk_mb, processes, memory_bytes, output_chars)
    finally:
        remove_tree(root)


def _run_in(root: str, spec: dict, calls: list, isolation: str, timeout_s: float, disk_mb: int, processes: int,
            memory_bytes: int, output_chars: int) -> SandboxRun:
    if isolation == BUBBLEWRAP:
        prefix, cwd = _bwrap_prefix(disk_mb), root
    else:
        prefix = ("unshare", *NAMESPACES, "--") if isolation == NAMESPACES_ONLY else ()
        cwd = os.path.join(root, "work")  # the program's cwd; its output file lies outside it
        os.mkdir(cwd)
    spec = {**spec, "limits": {**spec["limits"], "own_init": isolation == NAMESPACES_ONLY}}
    cgroup = RunCgroup.create(processes + CGROUP_EXTRA_PIDS, memory_bytes)
    output_path = os.path.join(root, "output")
    read_fd, write_fd = os.pipe()
    spec["report_fd"] = write_fd
    try:
        with open(output_path, "wb") as output:
            process = subprocess.Popen(
                cgroup.entering([*prefix, os.path.realpath(sys.executable), "-I", "-S", "-c", RUNNER_SOURCE]),
                stdin=subprocess.PIPE, stdout=output, stderr=subprocess.STDOUT, cwd=cwd,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"},
                pass_fds=(write_fd,), start_new_session=True,
            )
    except OSError:
        os.close(read_fd)
        cgroup.kill_all_and_remove()
        raise
    finally:
        os.close(write_fd)
    try:
        lines, unasked, timed_out = _collect(process, read_fd, json.dumps(spec), json.dumps(calls), timeout_s)
        if not timed_out:  # the channel closed: let the run end by itself, so its exit status is its own
            try:
                process.wait(timeout=EXIT_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
    finally:
        os.close(read_fd)
        _kill_group(process)
        over_memory = cgroup.over_memory()
        cgroup.kill_all_and_remove()
    if not lines and process.returncode == ENTRY_FAILED and cgroup.controllers:
        raise OSError(f"the run could not enter its cgroups ({', '.join(sorted(cgroup.controllers))})")
    with open(output_path, "rb") as output:
        text = output.read(output_chars * 4).decode("utf-8", errors="replace")[:output_chars]
    return SandboxRun(lines, unasked, timed_out, process.returncode, text, isolation, over_memory)


def _collect(process: subprocess.Popen, read_fd: int, spec: str, calls: str,
             timeout_s: float) -> tuple[list[dict], int, bool]:
    """Send the spec; once the runner says the program has run ("ready"), send the calls; read report
    lines until "done", the pipe's end, or the deadline. Returns the lines, the number of answers that
    came before the calls were sent, and whether the deadline passed."""
    deadline = time.monotonic() + timeout_s
    buffer, before, timed_out = b"", None, False
    _send(process, spec + "\n", close=False)
    while b'{"done": true}' not in buffer:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        if not select.select([read_fd], [], [], remaining)[0]:
            continue
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        if len(buffer) < MAX_REPORT_BYTES:
            buffer += chunk[: MAX_REPORT_BYTES - len(buffer)]
        if before is None and b'{"ready": true}' in buffer:
            before = parse_lines(buffer)
            _send(process, calls + "\n", close=True)
    lines = parse_lines(buffer)
    unasked = sum(1 for line in (lines if before is None else before) if "call" in line)
    return lines, unasked, timed_out


def _send(process: subprocess.Popen, text: str, close: bool) -> None:
    try:
        process.stdin.write(text.encode())
        process.stdin.flush()
        if close:
            process.stdin.close()
    except OSError:  # the runner is gone; its exit status says the rest
        pass


def parse_lines(buffer: bytes) -> list[dict]:
    """The JSON objects among ``buffer``'s lines; anything else (a line cut by a kill, bytes the program
    wrote itself, nesting deep enough to exhaust the parser) is dropped, never raised."""
    lines = []
    for raw in buffer.splitlines():
        try:
            line = json.loads(raw)
        except (ValueError, RecursionError, MemoryError):
            continue
        if type(line) is dict:
            lines.append(line)
    return lines


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the run's whole process group (bwrap or unshare, and so the pid namespace), then reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
