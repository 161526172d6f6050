"""The sandboxed side of :mod:`rewards.code`, and the plain-data codec both sides share.

Started by ``rewards.code_sandbox`` as ``python -I -S -c <this file's source>`` (no site-packages,
no PYTHONPATH, the standard library only) inside the sandbox. Reads one JSON line from stdin,
``{"setup", "code", "report_fd", "limits"}``, runs ``setup`` then the candidate ``code`` in one
namespace and writes ``{"ready": true}`` to ``report_fd``; only then does the parent send the
second line, the calls ``[[name, args, kwargs], ...]`` (plain data, see :func:`encode`), so an answer
written before it is known to be forged. Each call runs on the function of that name and gets one
JSON line: ``{"call": i, "value": <encoded>}`` or ``{"call": i, "raised": "Type: message"}``; also
``{"code_error": str}``, ``{"violation": event}`` and ``{"done": true}``.

The candidate never sees a test or an expected value: it only answers calls. Whatever it writes
on the channel can at most claim that its function returned some plain value, which it could have
returned anyway; the verdict is the parent's (``rewards.code``), on values it decodes itself.
"""

import json
import math
import os
import resource
import signal
import sys
import time
import traceback

MAX_DEPTH = 64  # nesting of an encoded value; deeper is refused on both sides
MAX_ITEMS = 100_000  # elements of an encoded value, all containers together
MAX_ERROR_CHARS = 300
# Operations the audit hook refuses: new processes, sockets and native code. The sandbox holds
# without it (see rewards/code_sandbox.py); it turns the common cases into a clear "refused" status.
PROCESS_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "os.startfile",
    "subprocess.Popen", "pty.spawn",
})
REFUSED_PREFIXES = ("socket.", "ctypes.")


class NotPlain(ValueError):
    """A value outside the plain types, or past the depth or size limits."""


def _spend(budget, depth):
    """One more element against the value's budget (a one-item list shared by the whole walk)."""
    budget = budget if budget is not None else [MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise NotPlain(f"more than {MAX_ITEMS} elements or {MAX_DEPTH} levels of nesting")
    return budget


def encode(value, budget=None, depth=0):
    """``value`` as JSON-able data keeping exact builtin types: None, bool, int, str and list as
    themselves, finite floats as themselves, and tagged one-key dicts for the rest:
    ``{"float": "nan"}``, ``{"tuple": [...]}``, ``{"set": [...]}``, ``{"frozenset": [...]}``,
    ``{"dict": [[k, v], ...]}``, ``{"bytes": hex}``, ``{"complex": [re, im]}``. A subclass of any of
    these (a str whose ``__eq__`` is always true) is not plain: NotPlain."""
    budget = _spend(budget, depth)
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if kind is list:
        return [encode(item, budget, depth + 1) for item in value]
    if kind in (tuple, set, frozenset):
        return {kind.__name__: [encode(item, budget, depth + 1) for item in value]}
    if kind is dict:
        return {"dict": [[encode(k, budget, depth + 1), encode(v, budget, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind is complex:
        return {"complex": [encode(value.real, budget, depth + 1), encode(value.imag, budget, depth + 1)]}
    raise NotPlain(f"a {kind.__name__} is not plain data (None, bool, int, float, str, bytes, complex, "
                   "list, tuple, set, frozenset, dict)")


def decode(wire, budget=None, depth=0):
    """The value :func:`encode` wrote, built from exact builtin types only; NotPlain for anything
    else (unknown tags, unhashable set members or keys, too deep, too many elements)."""
    budget = _spend(budget, depth)
    kind = type(wire)
    if wire is None or kind in (bool, int, float, str):  # JSON's own: a float here is finite
        return wire
    if kind is list:
        return [decode(item, budget, depth + 1) for item in wire]
    if kind is not dict or len(wire) != 1:
        raise NotPlain(f"not an encoded value: a {kind.__name__}")
    ((tag, body),) = wire.items()
    try:
        if tag == "float" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "bytes" and type(body) is str:
            return bytes.fromhex(body)
        if type(body) is not list:
            raise NotPlain(f"not an encoded value: tag {str(tag)[:20]!r}")
        items = [decode(item, budget, depth + 1) for item in body]
        if tag in ("tuple", "set", "frozenset"):
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
        if tag == "dict" and all(type(pair) is list and len(pair) == 2 for pair in items):
            return dict(items)
        if tag == "complex" and len(items) == 2 and all(type(part) in (int, float) for part in items):
            return complex(*items)
    except TypeError as exc:  # an unhashable set member or dict key
        raise NotPlain(str(exc)[:100]) from None
    raise NotPlain(f"not an encoded value: tag {str(tag)[:20]!r}")


def wait_as_init(deadline_s):
    """As pid 1 of a fresh pid namespace (the ``unshare`` fallback; bubblewrap has its own): run the
    rest in a child, reap orphans, and end the namespace when that child ends or the deadline passes.
    The program must not be pid 1 itself: pid 1 ignores signals it has no handler for."""
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


def set_limits(limits):
    """Hard limits equal to the soft ones, so the program cannot raise them back."""
    cpu = limits["cpu_s"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at cpu_s, SIGKILL a second later
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # A write past RLIMIT_FSIZE then fails with EFBIG (an exception the program sees) instead of killing it.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def install_guard(report):
    """An audit hook refusing signals to other processes, new processes, sockets and native code,
    each refusal reported. Defence in depth only: code written to pass it is held by the sandbox."""
    own_pid = os.getpid()

    def guard(event, args):
        if event == "os.kill":
            deny = args[0] != own_pid
        else:
            deny = event == "os.killpg" or event in PROCESS_EVENTS or event.startswith(REFUSED_PREFIXES)
        if deny:
            report({"violation": event})
            raise PermissionError(f"sandbox: {event} is not allowed")

    sys.addaudithook(guard)


def error_text(exc):
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


def print_traceback(exc):
    """The program's traceback on its output, without this runner's frame; never fails (the output may be full)."""
    try:
        traceback.print_exception(exc.with_traceback(exc.__traceback__.tb_next))
    except Exception:
        pass


def main():
    spec = json.loads(sys.stdin.readline())
    if os.getpid() == 1 and spec["limits"].get("own_init"):
        wait_as_init(spec["limits"]["init_deadline_s"])
    report_fd, dumps, encode_value, write = spec["report_fd"], json.dumps, encode, os.write  # before the program can rebind them

    def report(line):
        write(report_fd, (line if isinstance(line, str) else dumps(line)).encode() + b"\n")

    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")
    sys.stderr.reconfigure(encoding="utf-8", errors="backslashreplace")
    set_limits(spec["limits"])
    install_guard(report)
    source = spec.pop("setup") + "\n" + spec.pop("code")
    namespace = {"__name__": "solution"}
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the program does not end the run
        report({"code_error": error_text(exc)})
        print_traceback(exc)
    # Only now does the parent send the calls: an answer on the channel before this line is forged.
    report({"ready": True})
    calls = [(name, decode(args), decode(kwargs)) for name, args, kwargs in json.loads(sys.stdin.readline())]
    for index, (name, args, kwargs) in enumerate(calls):
        try:
            if name not in namespace:
                raise NameError(f"name {name!r} is not defined")
            line = dumps({"call": index, "value": encode_value(namespace[name](*args, **kwargs))})
        except BaseException as exc:  # json.dumps too: an int past Python's digit limit
            line = {"call": index, "raised": error_text(exc)}
        report(line)
    try:
        sys.stdout.flush()
    except OSError:  # past the output's size limit: what was written stays
        pass
    report({"done": True})
    os._exit(0)  # no atexit handlers or lingering threads of the program's: the run is over


if __name__ == "__main__":
    main()
