"""A hard time limit for checks that may hang: persistent, killable worker processes.

Why a subprocess and not SIGALRM or a thread: sympy can hang inside C code
(big-integer powers) where no Python-level signal is delivered, alarms only
work in the main thread and would steal the caller's SIGALRM, and a thread
cannot be killed. A worker started with `subprocess` also works from threads,
asyncio code, and daemonic pool workers (where multiprocessing refuses to fork).

Protocol: the parent writes a length-prefixed pickle `(function, args)` to the
worker's stdin (the parent's own trusted objects); the worker answers with one
JSON line. Only JSON (plain numbers, strings, lists, dicts) ever leaves a worker,
so objects that hang on str() or pickling never reach the caller.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

IN_WORKER_ENV = "RLVR_REWARDS_WORKER"  # set inside workers: the parent enforces the limit there
STARTUP_TIMEOUT_S = 60.0  # importing sympy on a loaded machine; never counted in a check's limit
_MAX_REPLY_BYTES = 1 << 20


class CheckTimeout(TimeoutError):
    """The worker did not answer within the limit; it has been killed."""


class WorkerError(RuntimeError):
    """The worker died or answered something that is not a valid reply."""


def in_worker() -> bool:
    return os.environ.get(IN_WORKER_ENV) == "1"


def to_plain(value: Any, depth: int = 0) -> Any:
    """JSON-safe copy keeping only plain data; anything else becomes its type name (never str())."""
    if value is None or isinstance(value, (bool, float)):
        return value if not isinstance(value, float) or math.isfinite(value) else repr(value)
    if isinstance(value, int):
        return value if value.bit_length() < 63 else float(value) if value.bit_length() < 1000 else "<big int>"
    if isinstance(value, str):
        return value[:2000]
    if depth < 4 and isinstance(value, (list, tuple)):
        return [to_plain(v, depth + 1) for v in value[:100]]
    if depth < 4 and isinstance(value, dict):
        return {str(k)[:100] if isinstance(k, (str, int)) else type(k).__name__: to_plain(v, depth + 1)
                for k, v in list(value.items())[:100]}
    return f"<{type(value).__name__}>"


class Worker:
    """One persistent child process running calls one at a time under a deadline."""

    def __init__(self) -> None:
        # the worker must import what the caller can (verifiers are pickled by module and name)
        path = os.pathsep.join(p for p in sys.path if isinstance(p, str) and p)
        env = dict(os.environ, **{IN_WORKER_ENV: "1", "PYTHONPATH": path})
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rewards.sandbox"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, bufsize=0,
        )
        self._buffer = b""
        ready = self._read_line(time.monotonic() + STARTUP_TIMEOUT_S)
        if ready != b"ready":
            self.kill()
            raise WorkerError("rewards worker failed to start")

    def call(self, function: Callable, args: tuple, timeout: float, raw: bool = False) -> Any:
        """function(*args) in the worker; its JSON-plain result (as returned where ``raw``: the function's
        own promise of JSON data), or CheckTimeout after `timeout` seconds."""
        payload = pickle.dumps((function, args, raw), protocol=pickle.HIGHEST_PROTOCOL)
        # The clock starts before the request goes out: a deadline taken after the write let a worker that the write
        # woke answer first, while this thread waited for a core, and a reply was already in at a 1 us limit.
        deadline = time.monotonic() + timeout
        try:
            self.process.stdin.write(struct.pack("<Q", len(payload)) + payload)
        except (BrokenPipeError, OSError) as exc:
            self.kill()
            raise WorkerError("rewards worker is gone") from exc
        try:
            line = self._read_line(deadline)
        except BaseException:
            # Anything else in flight (Ctrl-C caught by the caller, a bad timeout): the reply still to
            # come would answer the next request, so this worker must never be reused.
            self.kill()
            raise
        try:
            reply = json.loads(line)
        except ValueError as exc:
            self.kill()
            raise WorkerError("malformed reply from rewards worker") from exc
        if "error" in reply:
            raise WorkerError(reply["error"])
        return reply["result"]

    def _read_line(self, deadline: float) -> bytes:
        stdout = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            # select() overflows past ~1e10 s: wait in bounded slices, the deadline still decides
            if remaining <= 0 or not select.select([stdout], [], [], min(remaining, 3600.0))[0]:
                if time.monotonic() < deadline:
                    continue
                self.kill()
                raise CheckTimeout("check exceeded its time limit")
            chunk = os.read(stdout, 65536)
            if not chunk or len(self._buffer) > _MAX_REPLY_BYTES:
                self.kill()
                raise WorkerError("rewards worker exited")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass


class WorkerSet:
    """Idle workers shared by all threads: a call takes one (or starts one) and gives it back if still alive."""

    def __init__(self) -> None:
        self._idle: list[Worker] = []
        self._lock = threading.Lock()
        self._all: list[Worker] = []
        self._pid = os.getpid()

    def call(self, function: Callable, args: tuple, timeout: float, raw: bool = False) -> Any:
        worker = self._acquire()
        try:
            return worker.call(function, args, timeout, raw)
        finally:
            with self._lock:
                if worker.alive:
                    self._idle.append(worker)
                else:
                    self._all.remove(worker)

    def _acquire(self) -> Worker:
        with self._lock:
            if self._pid != os.getpid():  # forked child: the parent's pipes are not ours
                self._idle, self._all, self._pid = [], [], os.getpid()
            if self._idle:
                return self._idle.pop()
        worker = Worker()
        with self._lock:
            self._all.append(worker)
        return worker

    def shutdown(self) -> None:
        with self._lock:
            workers, self._idle, self._all = self._all, [], []
        if self._pid == os.getpid():
            for worker in workers:
                worker.kill()


WORKERS = WorkerSet()
atexit.register(WORKERS.shutdown)


def run_limited(function: Callable, args: tuple, timeout: float, *, raw: bool = False) -> Any:
    """function(*args) under a hard limit; in a worker already, run directly (the parent holds the limit).
    The result goes through to_plain, except with ``raw``: for this project's functions that return
    JSON data of their own making, larger than to_plain keeps."""
    if in_worker():
        result = function(*args)
        return result if raw else to_plain(result)
    return WORKERS.call(function, args, timeout, raw)


def _serve() -> None:
    # The protocol owns the real stdout; stray prints from user code go to stderr.
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    source = sys.stdin.buffer
    import rewards.symbolic  # noqa: F401  (pay sympy's import before "ready", outside any check's limit)

    out.write(b"ready\n")
    while True:
        header = source.read(8)
        if len(header) < 8:
            return
        (size,) = struct.unpack("<Q", header)
        request = source.read(size)
        try:
            function, args, raw = pickle.loads(request)
            result = function(*args)
            reply = {"result": result if raw else to_plain(result)}
        except Exception as exc:  # report any failure as data; the parent decides the status
            reply = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        try:
            line = json.dumps(reply)
        except (TypeError, ValueError) as exc:  # a raw result that is not JSON data after all
            line = json.dumps({"error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        out.write(line.encode() + b"\n")


if __name__ == "__main__":
    _serve()
