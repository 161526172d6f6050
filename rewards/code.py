"""A code verifier whose verdict the candidate program cannot reach: unit tests judged outside its process.

    from rewards.code import code_verifier, run_code
    run_code("def add(a, b):\\n    return a + b", ["assert add(1, 2) == 3"])   # CodeRun(status='ok', passed=1, total=1, ...)
    code_verifier("```python\\ndef add(a, b): return a + b\\n```", answer=["assert add(1, 2) == 3"])  # VerifyResult(1.0, 'ok')

How a run goes:

1. The test statements (MBPP's ``assert f(x) == y``, ``assert not f(x)``, ``assert
   math.isclose(f(x), y)``, ``assert set(f(x)) == {...}``) are evaluated on this side, in a rewards
   worker under a hard time limit (``rewards.sandbox.run_limited``), with every name the tests call
   but do not define (the candidate's functions) replaced by a stub. A stub answers from the values
   the sandbox returned, or records the call it still needs.
2. The recorded calls, and nothing else of the tests, go to the sandbox (``rewards.code_sandbox``:
   bubblewrap), which runs the test setup, then the program, then each call, and returns each
   result as plain data with exact builtin types (``rewards.code_runner.encode``): a ``str``
   subclass whose ``__eq__`` is always true is not a ``str`` and fails its test.
3. The tests are evaluated again on those values; a call whose arguments need another call's result
   (``f(g(1))``) takes one more round, at most ``MAX_ROUNDS``.

So the program never sees a test or an expected value, and whatever it writes or patches can only
change what its own functions return. What this does not guarantee is in docs/rewards.md.
"""

from __future__ import annotations

import ast
import builtins
import json
import math
import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .code_runner import NotPlain, decode, encode
from .code_sandbox import RLIMITS_ONLY, SandboxRun, run_sandboxed
from .result import ERROR, NO_ANSWER, OK, TIMEOUT, VerifyResult
from .sandbox import CheckTimeout, WorkerError, run_limited

MAX_CODE_CHARS = 100_000
MAX_TESTS = 500
MAX_ROUNDS = 3  # sandbox runs per completion: one, plus one per level of calls nested in calls
MAX_VALUE_CHARS = 80  # of a returned value quoted in a failed test's message
# Modules a test may use without importing them (MBPP's tests use math; the rest are common in others).
TEST_MODULES = ("math", "cmath", "re", "collections", "itertools", "functools", "heapq", "string", "fractions", "decimal")
_FENCED = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class CodeLimits:
    """Hard limits of one run. ``timeout_s``: wall clock of each sandbox run (and of each evaluation
    of the tests), after which it is killed; ``cpu_s``: CPU seconds (RLIMIT_CPU); ``memory_mb``: memory
    of the whole run, every process and the files of its tmpfs together (a memory cgroup, swap off,
    where one can be made: past it the kernel kills the run), and address space of each process
    (RLIMIT_AS, so MemoryError past it); ``file_mb``: largest file it may write, its output included
    (RLIMIT_FSIZE); ``disk_mb``: size of its working directory (a tmpfs, under bubblewrap);
    ``processes``: processes and threads alive at once in the whole run (a pids cgroup where one can
    be made, and RLIMIT_NPROC); ``output_chars``: how much of its stdout/stderr comes back;
    ``isolate``: run in the sandbox (bubblewrap, else namespaces); False = rlimits only.
    What holds on which machine: docs/environments.md, "The code sandbox"."""

    timeout_s: float = 4.0
    cpu_s: int = 3
    memory_mb: int = 512
    file_mb: int = 1
    disk_mb: int = 16
    processes: int = 16
    output_chars: int = 4000
    isolate: bool = True

    def __post_init__(self) -> None:
        if not (isinstance(self.timeout_s, (int, float)) and math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {self.timeout_s!r}")
        for name in ("cpu_s", "memory_mb", "file_mb", "disk_mb", "processes", "output_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.isolate, bool):
            raise ValueError(f"isolate must be true or false, got {self.isolate!r}")


@dataclass(frozen=True)
class CodeRun:
    """What one run did. ``status``: ok (every call the tests needed was answered, within the limits,
    nothing refused), timeout (wall clock or CPU limit), error (a refused operation, the memory limit,
    the program ended the run or wrote answers of its own, a test that cannot be evaluated, or the
    sandbox failed); ``reason`` says which. ``score`` is the fraction of tests passed when ok, else 0;
    ``solved``: ok with every test passed."""

    status: str
    passed: int = 0
    total: int = 0
    output: str = ""
    reason: str = ""
    test_errors: tuple[str, ...] = ()
    violations: tuple[str, ...] = ()
    isolation: str = RLIMITS_ONLY

    @property
    def score(self) -> float:
        return self.passed / self.total if self.status == OK and self.total else 0.0

    @property
    def solved(self) -> bool:
        return self.status == OK and self.total > 0 and self.passed == self.total

    def details(self) -> dict[str, Any]:
        details = {"passed": self.passed, "total": self.total, "isolation": self.isolation}
        if self.reason:
            details["reason"] = self.reason
        if self.test_errors:
            details["test_errors"] = list(self.test_errors[:10])
        if self.violations:
            details["violations"] = list(self.violations)
        return details


def extract_code(completion: str) -> str | None:
    """The last fenced code block (```python, ```py or bare ```) of a completion, or None."""
    blocks = _FENCED.findall(completion)
    return blocks[-1] if blocks else None


# -- this side of the boundary: the tests, evaluated on the values the sandbox returned ---------------

class _Pending:
    """What a stub returns for a call the sandbox has not answered yet: the test's outcome is void."""

    def __repr__(self) -> str:
        return "<pending>"


class _CandidateRaised(Exception):
    """The candidate's function raised (in the sandbox); the test that called it fails."""


def call_key(name: str, args: tuple, kwargs: dict) -> str:
    """One call as JSON text: the sandbox's request, and the key of its answer. NotPlain for arguments
    that are not plain data (a lambda, or a value still pending)."""
    return json.dumps([name, encode(tuple(args)), encode(dict(kwargs))], sort_keys=True)


class _Stub:
    """Stands for the candidate's function ``name`` in the tests."""

    def __init__(self, name: str, answers: Mapping[str, list], pending: list[str], seen: list[str],
                 waiting: list[str]) -> None:
        self.name, self.answers, self.pending, self.seen, self.waiting = name, answers, pending, seen, waiting

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = call_key(self.name, args, kwargs)
        answer = self.answers.get(key)
        if answer is None:
            if key not in self.pending:
                self.pending.append(key)
            self.waiting.append(key)
            return _Pending()
        call = f"{self.name}({_clip(', '.join([repr(a) for a in args] + [f'{k}={v!r}' for k, v in kwargs.items()]))})"
        kind, payload = answer
        if kind == "raised":
            self.seen.append(f"{call} raised {payload}")
            raise _CandidateRaised(payload)
        try:
            value = decode(payload)
        except (NotPlain, RecursionError, ValueError, MemoryError) as exc:
            self.seen.append(f"{call} returned something that is not plain data")
            raise _CandidateRaised(f"not plain data: {str(exc)[:100]}") from None
        self.seen.append(f"{call} returned {_clip(repr(value))}")
        return value


def _clip(text: str) -> str:
    """``text`` cut to MAX_VALUE_CHARS for a failed test's message, "..." marking a cut."""
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + "..."


def _test_namespace(setup: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__builtins__": builtins, "__name__": "tests"}
    for module in TEST_MODULES:
        namespace[module] = __import__(module)
    if setup:
        exec(compile(setup, "test_setup", "exec"), namespace)
    return namespace


def _called_names(tree: ast.AST, namespace: Mapping[str, Any]) -> set[str]:
    """Names the test reads but neither it, its setup nor Python defines: the candidate's."""
    stored = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load)}
    stored |= {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree)
               if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    loaded = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    return {name for name in loaded - stored if name not in namespace and not hasattr(builtins, name)}


def evaluate_tests(tests: Sequence[str], setup: str, answers: Mapping[str, list]) -> dict[str, Any]:
    """Each test's outcome on the sandbox's ``answers`` (call key -> ["value", encoded] or ["raised",
    text]): ``{"passed": [bool], "errors": [str], "pending": [call key]}``; a test with a pending call
    is neither passed nor failed yet. Runs in a rewards worker (``run_limited``): the tests are the
    dataset's code, the values the candidate's data, and neither may hang or crash the caller."""
    try:
        base = _test_namespace(setup)
    except BaseException as exc:
        return {"passed": [False] * len(tests), "errors": [f"test setup: {type(exc).__name__}: {str(exc)[:200]}"],
                "pending": [], "invalid": True}
    passed, errors, pending = [], [], []
    for index, test in enumerate(tests):
        seen, waiting = [], []
        try:
            tree = ast.parse(test, f"test_{index}", "exec")
            namespace = dict(base)
            namespace.update({name: _Stub(name, answers, pending, seen, waiting) for name in _called_names(tree, base)})
            exec(compile(tree, f"test_{index}", "exec"), namespace)
            ok, error = True, ""
        except SyntaxError as exc:  # the dataset's, not the candidate's: the run is an error
            return {"passed": [False] * len(tests), "errors": [f"test {index} is not Python: {exc}"],
                    "pending": [], "invalid": True}
        except _CandidateRaised as exc:
            ok, error = False, f"test {index}: {seen[-1] if seen else exc}"
        except BaseException as exc:  # AssertionError, or the test's own code on the candidate's values
            message = f": {str(exc)[:100]}" if str(exc) else ""
            because = f" ({'; '.join(seen)})" if seen else ""
            ok, error = False, f"test {index}: {type(exc).__name__}{message}{because}"
        if waiting:
            ok, error = False, ""  # not decided: the calls it made are not all answered yet
        passed.append(ok)
        if error:
            errors.append(error[:300])
    return {"passed": passed, "errors": errors, "pending": pending}


# -- the run -----------------------------------------------------------------------------------------

def run_code(code: str, tests: Sequence[str] = (), *, setup: str = "", limits: CodeLimits = CodeLimits()) -> CodeRun:
    """Run ``setup + code`` in the sandbox and judge each test statement on this side (see the module's
    docstring); with no tests, just run it (its output is ``output``). Never raises on what the code
    does; safe from threads, asyncio (``await asyncio.to_thread(run_code, ...)``) and worker processes."""
    if len(code) > MAX_CODE_CHARS or len(tests) > MAX_TESTS:
        return CodeRun(ERROR, total=len(tests), reason=f"over {MAX_CODE_CHARS} characters of code or {MAX_TESTS} tests")
    answers: dict[str, list] = {}
    verdict = _evaluate(tests, setup, answers, limits) if tests else {"passed": [], "errors": [], "pending": []}
    first: SandboxRun | None = None
    for _ in range(MAX_ROUNDS):
        if "reason" in verdict:
            return CodeRun(ERROR, total=len(tests), reason=verdict["reason"], output=first.output if first else "")
        if first is not None and not verdict["pending"]:
            break
        run, problem = _answer(code, setup, verdict["pending"], answers, limits)
        first = first or run
        if problem is not None:
            status, reason = problem
            return CodeRun(status, 0, len(tests), first.output if first else "", reason, (),
                           _violations(run) if run else (), run.isolation if run else RLIMITS_ONLY)
        if tests:
            verdict = _evaluate(tests, setup, answers, limits)
    else:
        if verdict["pending"]:
            return CodeRun(ERROR, total=len(tests), reason=f"calls nested more than {MAX_ROUNDS} deep in the tests",
                           output=first.output, isolation=first.isolation)
    code_errors = [str(line["code_error"]) for line in first.lines if "code_error" in line]
    return CodeRun(OK, sum(verdict["passed"]), len(tests), first.output, code_errors[0] if code_errors else "",
                   tuple(code_errors + verdict["errors"]), (), first.isolation)


def _evaluate(tests: Sequence[str], setup: str, answers: dict[str, list], limits: CodeLimits) -> dict[str, Any]:
    try:
        verdict = run_limited(evaluate_tests, (list(tests), setup, answers), limits.timeout_s, raw=True)
    except CheckTimeout:
        return {"reason": f"the tests took over {limits.timeout_s} s to evaluate on the program's values"}
    except WorkerError as exc:
        return {"reason": f"the tests could not be evaluated: {str(exc)[:200]}"}
    if verdict.get("invalid"):
        return {"reason": verdict["errors"][0]}
    return verdict


def _answer(code: str, setup: str, keys: list[str], answers: dict[str, list],
            limits: CodeLimits) -> tuple[SandboxRun | None, tuple[str, str] | None]:
    """Run the program on the calls ``keys`` in one sandbox, adding their answers to ``answers``.
    Returns the run and, if it cannot be trusted to the end, why: (status, reason)."""
    spec = {
        "code": code, "setup": setup,
        "limits": {
            "cpu_s": limits.cpu_s, "memory_bytes": limits.memory_mb << 20, "file_bytes": limits.file_mb << 20,
            "processes": limits.processes, "init_deadline_s": limits.timeout_s + 1.0,
        },
    }
    try:
        run = run_sandboxed(spec, [json.loads(key) for key in keys], timeout_s=limits.timeout_s,
                            disk_mb=limits.disk_mb, processes=limits.processes,
                            memory_bytes=limits.memory_mb << 20, output_chars=limits.output_chars,
                            isolate=limits.isolate)
    except OSError as exc:
        return None, (ERROR, f"could not start the sandbox: {exc}")
    violations = _violations(run)
    answered: dict[int, list] = {}
    twice = []
    for line in run.lines:
        index = line.get("call")
        if type(index) is not int or not 0 <= index < len(keys) or not ({"value", "raised"} & line.keys()):
            continue
        if index in answered:
            twice.append(index)
        answered[index] = ["value", line["value"]] if "value" in line else ["raised", str(line["raised"])[:300]]
    cpu_killed = run.returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU)
    if run.over_memory:
        return run, (ERROR, f"over the memory limit ({limits.memory_mb} MB for the whole run)")
    if run.timed_out or cpu_killed:
        return run, (TIMEOUT, f"over {limits.cpu_s} s of CPU" if cpu_killed else f"over {limits.timeout_s} s")
    if violations:
        return run, (ERROR, "refused: " + ", ".join(violations))
    if run.unasked or twice:
        return run, (ERROR, "the program wrote answers on the report channel itself")
    missing = [index for index in range(len(keys)) if index not in answered]
    done = any(line.get("done") is True for line in run.lines)
    if missing or not done:
        return run, (ERROR, f"the program ended the run (exit status {run.returncode})")
    errors = [str(line["code_error"]) for line in run.lines if "code_error" in line]
    errors += [text for kind, text in answered.values() if kind == "raised"]
    if any(error.startswith("MemoryError") for error in errors):
        return run, (ERROR, f"over the memory limit ({limits.memory_mb} MB)")
    answers.update({keys[index]: answer for index, answer in answered.items()})
    return run, None


def _violations(run: SandboxRun) -> tuple[str, ...]:
    return tuple(sorted({str(line["violation"])[:100] for line in run.lines if "violation" in line}))


@dataclass(frozen=True)
class CodeVerifier:
    """Scores a completion's last fenced code block on the gold tests: 1.0 when every test passes,
    else 0 (all or nothing, the convention of the code-RL recipes: DeepCoder, verl's code rewards).

    ``partial_credit=True`` pays the fraction of tests passed instead, which a policy can farm without
    solving anything: a function that returns ``True`` for every call passes ``assert f(x)`` tests, and
    one that returns ``None``, ``0``, ``[]`` or ``''`` passes ``assert not f(x)``, ``assert f(0) == 0``
    and ``assert f([]) == []`` (0.33 to 0.67 on MBPP-style problems).

    ``answer``: the test statements, or ``{"tests": [...], "setup": "..."}`` (MBPP's test_setup_code,
    run before the program in the sandbox and before the tests on this side). Status no_answer when
    the completion has no code block; otherwise the run's status (see CodeRun).
    ``details["components"]["correct"]`` is the score, so all tests passed is what counts as solved."""

    limits: CodeLimits = field(default_factory=CodeLimits)
    partial_credit: bool = False

    def __call__(self, completion: str, *, answer: Any, **info: Any) -> VerifyResult:
        tests, setup = (answer.get("tests", ()), answer.get("setup", "")) if isinstance(answer, Mapping) else (answer, "")
        if isinstance(tests, str) or not all(isinstance(t, str) for t in tests) or not isinstance(setup, str):
            raise ValueError(f"code tests must be a list of statements (with an optional setup string), got {answer!r}")
        code = extract_code(completion) if isinstance(completion, str) else None
        if code is None:
            return VerifyResult(0.0, NO_ANSWER, {"components": {"correct": 0.0}, "reason": "no fenced code block"})
        run = run_code(code, list(tests), setup=setup, limits=self.limits)
        score = run.score if self.partial_credit else float(run.solved)
        return VerifyResult(score, run.status, {**run.details(), "components": {"correct": score}})


code_verifier = CodeVerifier()
