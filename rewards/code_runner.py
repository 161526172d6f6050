"""The sandboxed side of :mod:`rewards.code`: one candidate program and its tests in a fresh process.

Started by ``rewards.code.run_code`` as ``python -I -S code_runner.py`` (no site-packages, no
PYTHONPATH, standard library only), in its own session, with a throwaway directory as cwd and a
file as stdout/stderr; on Linux where allowed, inside fresh user, pid and network namespaces.
Reads one JSON spec from stdin, ``{"code", "setup", "tests", "report_fd", "limits"}``, and writes
JSON lines to ``report_fd``: ``{"test": i, "passed": bool, "error": str}``, ``{"code_error": str}``,
``{"violation": event}`` and, when it got to the end, ``{"done": true}``.
"""

import json
import os
import resource
import signal
import sys
import time
import traceback

# Operations the audit hook refuses outright: new processes, sockets and native code.
PROCESS_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "os.startfile",
    "subprocess.Popen", "pty.spawn",
})
REFUSED_PREFIXES = ("socket.", "ctypes.")
# Events whose path arguments must lie inside the working directory.
PATH_EVENTS = frozenset({
    "os.remove", "os.rmdir", "os.mkdir", "os.rename", "os.chmod", "os.chown", "os.truncate",
    "os.symlink", "os.link", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile",
})
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
MAX_ERROR_CHARS = 300


def wait_as_init(deadline_s: float) -> None:
    """As pid 1 of a fresh pid namespace: run the rest in a child, reap orphans, and end the whole
    namespace (every process in it) when that child ends or the deadline passes.

    The program must not be pid 1 itself: pid 1 ignores signals it has no handler for (SIGXCPU from
    RLIMIT_CPU, a program's own os.kill), and nothing inside the namespace can signal this process."""
    child = os.fork()
    if child == 0:
        return
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)  # killed by signal N -> 128 + N, as a shell reports it
        if pid == 0:
            time.sleep(0.01)
    os._exit(128 + signal.SIGKILL)


def set_limits(limits: dict) -> None:
    """Hard limits equal to the soft ones, so the program cannot raise them back."""
    cpu = limits["cpu_s"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at cpu_s, SIGKILL a second later
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # A write past RLIMIT_FSIZE then fails with EFBIG (an exception the program sees) instead of killing it.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def install_guard(workdir: str, report) -> None:
    """An audit hook refusing what the rlimits cannot: signals to other processes, new processes,
    sockets, native code, and writes outside ``workdir``. Every refusal is reported."""
    own_pid = os.getpid()
    checking = []  # re-entrancy guard: resolving a path may raise audit events of its own

    def inside(path) -> bool:
        if isinstance(path, int) or path is None:  # an open file descriptor, or no path argument
            return True
        real = os.path.realpath(os.fsdecode(path))
        return real == workdir or real.startswith(workdir + os.sep) or real == os.devnull

    def writes(event: str, args: tuple) -> bool:
        if event != "open":
            return event in PATH_EVENTS
        _, mode, flags = args
        return (isinstance(mode, str) and bool(set(mode) & set("wax+"))) or (isinstance(flags, int) and bool(flags & WRITE_FLAGS))

    def refused(event: str, args: tuple) -> bool:
        if event == "os.kill":
            return args[0] != own_pid
        if event == "os.killpg" or event in PROCESS_EVENTS or event.startswith(REFUSED_PREFIXES):
            return True
        if (event == "open" or event in PATH_EVENTS) and writes(event, args):
            paths = args[:1] if event == "open" else [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
            return not all(inside(p) for p in paths)
        return False

    def guard(event: str, args: tuple) -> None:
        if checking:
            return
        checking.append(event)
        try:
            deny = refused(event, args)
        finally:
            checking.pop()
        if deny:
            report({"violation": event})
            raise PermissionError(f"sandbox: {event} is not allowed")

    sys.addaudithook(guard)


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


def print_traceback(exc: BaseException) -> None:
    """The program's traceback on its output, without this runner's frame; never fails (the output may be full)."""
    try:
        traceback.print_exception(exc.with_traceback(exc.__traceback__.tb_next))
    except Exception:
        pass


def main() -> None:
    spec = json.loads(sys.stdin.read())
    if os.getpid() == 1:
        wait_as_init(spec["limits"]["init_deadline_s"])
    report_fd = spec["report_fd"]

    def report(line: dict) -> None:
        os.write(report_fd, json.dumps(line).encode() + b"\n")

    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")
    sys.stderr.reconfigure(encoding="utf-8", errors="backslashreplace")
    set_limits(spec["limits"])
    install_guard(os.getcwd(), report)
    run, compile_ = exec, compile  # the program may rebind the builtins; the tests still run through these
    namespace = {"__name__": "solution"}
    try:
        run(compile_(spec["setup"] + "\n" + spec["code"], "solution.py", "exec"), namespace)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the program does not end the run
        report({"code_error": error_text(exc)})
        print_traceback(exc)
    for index, test in enumerate(spec["tests"]):
        try:
            run(compile_(test, f"test_{index}", "exec"), namespace)
            report({"test": index, "passed": True})
        except BaseException as exc:
            report({"test": index, "passed": False, "error": error_text(exc)})
    try:
        sys.stdout.flush()
    except OSError:  # past the output's size limit: what was written stays
        pass
    report({"done": True})
    os._exit(0)  # no atexit handlers or lingering threads of the program's: the run is over


if __name__ == "__main__":
    main()
