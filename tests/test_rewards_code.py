"""rewards.code: tests judged outside the candidate's process, the plain-data codec, the sandbox's isolation
and limits, from threads, asyncio and workers. The hostile-program suite is tests/test_code_hostile.py."""

import asyncio
import glob
import os
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest

from rewards import code_sandbox, score_batch
from rewards.code import CodeLimits, CodeVerifier, code_verifier, evaluate_tests, extract_code, run_code
from rewards.code_runner import MAX_DEPTH, NotPlain, decode, encode
from rewards.code_sandbox import BUBBLEWRAP, NAMESPACES_ONLY, RLIMITS_ONLY, available_isolation, parse_lines

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 5"]
SOLUTION = "def add(a, b):\n    return a + b\n"
FAST = CodeLimits(timeout_s=3.0, cpu_s=2)


def test_the_run_counts_tests_and_the_verifier_pays_all_or_nothing_unless_asked():
    run = run_code(SOLUTION + "print('working')", TESTS)
    assert (run.status, run.passed, run.total, run.score, run.solved) == ("ok", 2, 3, pytest.approx(2 / 3), False)
    assert run.output == "working\n" and run.test_errors == ("test 2: AssertionError (add(2, 2) returned 4)",)
    completion = f"```python\n{SOLUTION}```"
    assert code_verifier(completion, answer=TESTS).score == 0.0
    assert CodeVerifier(partial_credit=True)(completion, answer=TESTS).score == pytest.approx(2 / 3)
    assert code_verifier(completion, answer=TESTS[:2]).score == 1.0


def test_verifier_extracts_the_last_code_block():
    completion = f"First try:\n```python\ndef add(a, b): return 0\n```\nFixed:\n```python\n{SOLUTION}```"
    result = code_verifier(completion, answer=TESTS[:2])
    assert (result.score, result.status, result.details["components"]) == (1.0, "ok", {"correct": 1.0})
    assert extract_code("```py\nx = 1\n```") == "x = 1\n" and extract_code("no code here") is None
    assert code_verifier("def add(a, b): return a + b", answer=TESTS).status == "no_answer"  # no fence


def test_setup_code_and_a_broken_program():
    gold = {"tests": ["assert area() == 9"], "setup": "SIDE = 3"}
    result = code_verifier("```python\ndef area(): return SIDE ** 2\n```", answer=gold)
    assert result.score == 1.0
    broken = run_code("def add(a, b) return a", TESTS)  # a syntax error fails every test, status ok
    assert (broken.status, broken.passed, broken.score) == ("ok", 0, 0.0) and "SyntaxError" in broken.reason
    with pytest.raises(ValueError, match="list of statements"):
        code_verifier("```python\nx = 1\n```", answer="assert x == 1")  # a bad gold is the dataset's bug


def test_a_program_cannot_fake_its_end_with_sys_exit():
    run = run_code("import sys\nsys.exit(0)", ["assert False"])
    assert (run.status, run.passed) == ("ok", 0)
    run = run_code("import os\nos._exit(0)\n" + SOLUTION, TESTS[:1])
    assert (run.status, run.score) == ("error", 0.0) and "ended the run" in run.reason


@pytest.mark.parametrize("test, code", [
    ("assert not is_even(3)", "def is_even(n): return n % 2 == 0"),
    ("assert math.isclose(area(2), 12.566, rel_tol=0.001)", "import math\ndef area(r): return math.pi * r * r"),
    ("assert set(common([1, 2, 3], [2, 3, 4])) == {2, 3}", "def common(a, b): return [x for x in a if x in b]"),
    ("assert pair(1, b=2) == (1, 2)", "def pair(a, b): return (a, b)"),
    ("assert twice(twice(3)) == 12", "def twice(n): return n * 2"),  # a call in a call: a second round
    ("assert count({'a': 1, 2: [3]}) == {'keys': frozenset({'a', 2})}", "def count(d): return {'keys': frozenset(d)}"),
    ("result = shout('hi')\nassert result == 'HI!' and type(result) is str", "def shout(s): return s.upper() + '!'"),
])
def test_the_tests_mbpp_writes_are_judged_on_this_side(test, code):
    run = run_code(code, [test])
    assert (run.status, run.score) == ("ok", 1.0), run


def test_a_value_must_be_of_the_exact_plain_type():
    subclass = "class S(str):\n    __eq__ = lambda s, o: True\n    __hash__ = str.__hash__\ndef add(a, b): return S('x')"
    run = run_code(subclass, TESTS[:1])
    assert run.score == 0.0 and "not plain data" in run.test_errors[0]
    assert run_code("def add(a, b): return lambda: 3", TESTS[:1]).score == 0.0
    assert run_code("def add(a, b): return True", ["assert add(1, 0) == 1"]).score == 1.0  # Python's own True == 1


def test_test_setup_runs_on_both_sides_and_a_bad_test_is_an_error():
    gold = {"tests": ["assert check(double(4))"], "setup": "def check(x):\n    return x == 8"}
    # the program may not replace a helper the tests call: check() is the parent's
    assert code_verifier("```python\ncheck = lambda x: True\ndef double(n): return n\n```", answer=gold).score == 0.0
    assert code_verifier("```python\ndef double(n): return 2 * n\n```", answer=gold).score == 1.0
    bad = run_code(SOLUTION, ["assert add(1, 2) =="])
    assert bad.status == "error" and "not Python" in bad.reason
    unplain = run_code(SOLUTION, ["assert add(lambda: 1, 2) == 3"])
    assert unplain.score == 0.0 and "not plain data" in unplain.test_errors[0]


def test_answers_written_on_the_channel_before_the_calls_are_an_error():
    # every fd it holds: the channel keeps the parent's number, which depends on what the parent has open
    forger = ("import os, json\nline = (json.dumps({'call': 0, 'value': 3}) + '\\n').encode()\n"
              "for fd in map(int, os.listdir('/proc/self/fd')):\n    try: os.write(fd, line) if fd > 2 else None\n"
              "    except OSError: pass\n" + SOLUTION)
    run = run_code(forger, TESTS[:1])
    assert (run.status, run.score) == ("error", 0.0) and "report channel" in run.reason


def test_evaluation_waits_for_answers_and_never_raises():
    verdict = evaluate_tests(["assert f(1) == 2", "assert True"], "", {})
    assert verdict["passed"] == [False, True] and verdict["pending"] == ['["f", {"tuple": [1]}, {"dict": []}]']
    answers = {verdict["pending"][0]: ["value", 2]}
    assert evaluate_tests(["assert f(1) == 2"], "", answers) == {"passed": [True], "errors": [], "pending": []}
    forged = {verdict["pending"][0]: ["value", {"evil": 1}]}
    assert "not plain data" in evaluate_tests(["assert f(1) == 2"], "", forged)["errors"][0]
    assert evaluate_tests(["assert f(1) == 2"], "raise ValueError('x')", {})["invalid"]


def test_a_test_that_hangs_on_the_program_s_values_is_cut():
    run = run_code("def n(): return 10 ** 12", ["assert sum(range(n())) > 0"], limits=CodeLimits(timeout_s=2))
    assert (run.status, run.score) == ("error", 0.0) and "to evaluate" in run.reason


@pytest.mark.parametrize("value", [
    None, True, 0, -(2 ** 80), 1.5, float("inf"), float("nan"), "é", b"\x00\xff", 1 + 2j,
    [1, [2]], (1, (2,)), {1, 2}, frozenset({"a"}), {(1, 2): [3], "k": {"v": None}}, (),
])
def test_the_codec_keeps_exact_types(value):
    back = decode(encode(value))
    assert type(back) is type(value)
    assert back == value or (back != back and value != value)  # nan


def test_the_codec_refuses_what_is_not_plain():
    class Sub(int):
        pass

    for value in (Sub(1), [Sub(1)], object(), print, {1: Sub(2)}):
        with pytest.raises(NotPlain):
            encode(value)
    deep = []
    for _ in range(MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(NotPlain):
        encode(deep)
    for wire in ({"evil": []}, {"set": [[1]]}, {"dict": [[[1], 2]]}, {"tuple": "x"}, {"a": 1, "b": 2}, {"complex": ["x", 1]}):
        with pytest.raises(NotPlain):
            decode(wire)
    assert parse_lines(b"[" * 100_000 + b"\n{\"call\": 0}\nnot json\n[1]\n") == [{"call": 0}]


# Each program: a status, score 0, the caller unharmed, nothing left running. The host effects of
# programs written to escape are tests/test_code_hostile.py's.
HOSTILE = {
    "infinite loop": ("while True:\n    pass", {"timeout"}),
    "sleep forever": ("import time\ntime.sleep(1000)", {"timeout"}),
    "fork bomb": ("import os\nwhile True:\n    os.fork()", {"error"}),
    "subprocess": ("import subprocess\nsubprocess.run(['sleep', '100'])", {"error"}),
    "huge allocation": ("x = bytearray(10 ** 11)", {"error", "ok"}),
    "kill the parent": ("import os\nos.kill(PARENT, 9)", {"error"}),
    "kill the group": ("import os\nos.killpg(0, 9)", {"error"}),
    "write outside": ("open(OUTSIDE, 'w').write('escaped')", {"ok", "error"}),
    "delete outside": ("import os\nos.remove(OUTSIDE_EXISTING)", {"ok", "error"}),
    "network": ("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)", {"error"}),
    "ctypes": ("import ctypes\nctypes.CDLL(None).kill(PARENT, 9)", {"error"}),
    "exit without tests": ("import os\nos._exit(0)", {"error"}),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_programs_get_a_status_and_nothing_escapes(name, tmp_path):
    code, statuses = HOSTILE[name]
    outside, existing = tmp_path / "escaped.txt", tmp_path / "keep.txt"
    existing.write_text("keep")
    values = {"PARENT": os.getpid(), "OUTSIDE": str(outside), "OUTSIDE_EXISTING": str(existing)}
    preamble = "".join(f"{key} = {value!r}\n" for key, value in values.items())
    start = time.monotonic()
    run = run_code(preamble + code + "\ndef add(a, b):\n    return a + b", TESTS[:1], limits=FAST)
    assert run.status in statuses, run
    assert run.score == 0.0 and time.monotonic() - start < FAST.timeout_s + 3
    assert not outside.exists() and existing.read_text() == "keep"
    assert run_code(SOLUTION, TESTS[:1]).score == 1.0  # the caller and the next run are fine


def test_output_is_capped_and_the_working_directory_is_private_and_removed():
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "rlvr-code-*")))
    run = run_code("print('x' * 10 ** 7)\nopen('mine.txt', 'w').write('ok')", [], limits=CodeLimits(output_chars=100))
    assert len(run.output) == 100 and "File too large" in run.reason
    assert run_code("open('mine.txt', 'w').write('ok')\nprint(open('mine.txt').read())").output == "ok\n"
    deep = run_code("import os\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\n" + SOLUTION, TESTS[:1],
                    limits=CodeLimits(isolate=False))
    assert deep.score == 1.0  # without bubblewrap's tmpfs the tree is on this disk, and still removed
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "rlvr-code-*"))) == before


def test_isolation_is_reported_and_a_missing_bwrap_warns_once(monkeypatch):
    isolation = available_isolation()
    assert run_code("pass").isolation == isolation and isolation in (BUBBLEWRAP, NAMESPACES_ONLY, RLIMITS_ONLY)
    assert run_code("pass", limits=CodeLimits(isolate=False)).isolation == RLIMITS_ONLY
    real_which = code_sandbox.shutil.which
    monkeypatch.setattr(code_sandbox.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    code_sandbox.available_isolation.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="bubblewrap"):
            fallback = code_sandbox.available_isolation()
        assert fallback in (NAMESPACES_ONLY, RLIMITS_ONLY)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            code_sandbox.available_isolation()  # once: the probe is cached
        # the verdict is this side's whatever the isolation: an always-equal object still scores 0
        hack = "class S(int):\n    __eq__ = lambda s, o: True\n    __hash__ = int.__hash__\ndef add(a, b): return S(0)"
        assert run_code(hack, TESTS).score == 0.0 and run_code(SOLUTION, TESTS).isolation == fallback
    finally:
        code_sandbox.available_isolation.cache_clear()
    # without namespaces the audit hook and the rlimits still hold
    assert run_code("import os\nos.kill(1, 9)", limits=CodeLimits(isolate=False)).status == "error"
    assert run_code("while True: pass", limits=CodeLimits(isolate=False, timeout_s=2, cpu_s=1)).status == "timeout"


@pytest.mark.skipif(available_isolation() != BUBBLEWRAP, reason="bwrap is not installed (`make setup` installs it)")
def test_the_sandbox_sees_no_project_no_packages_and_no_network():
    probe = ("import os, sys, socket\n"
             "print(sorted(os.listdir('/')))\n"
             "print(os.getuid(), sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
             "print([p for p in sys.path if os.path.isdir(p) and os.listdir(p) and 'site-packages' in p])\n"
             "print(os.path.exists(" + repr(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + "))\n")
    lines = run_code(probe, limits=CodeLimits()).output.splitlines()
    assert "'etc'" not in lines[0] and "'home'" not in lines[0] and "'work'" not in lines[0]
    assert lines[1].startswith("65534 ") and lines[2] == "[]" and lines[3] == "False"


def test_from_threads_asyncio_and_worker_processes():
    completions = [f"```python\n{SOLUTION}```", "```python\nwhile True: pass\n```", "nothing"] * 2
    expected = [("ok", 2 / 3), ("timeout", 0.0), ("no_answer", 0.0)] * 2
    verifier = CodeVerifier(FAST, partial_credit=True)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda c: verifier(c, answer=TESTS), completions))
    assert [(r.status, pytest.approx(r.score)) for r in results] == expected

    async def score_all():
        return await asyncio.gather(*(asyncio.to_thread(verifier, c, answer=TESTS) for c in completions))

    assert [(r.status, pytest.approx(r.score)) for r in asyncio.run(score_all())] == expected
    batch = score_batch(completions, [TESTS] * len(completions), verifier=verifier, workers=2, timeout=3 * FAST.timeout_s + 5)
    assert [(r.status, pytest.approx(r.score)) for r in batch] == expected


def test_limits_are_validated():
    with pytest.raises(ValueError, match="timeout_s"):
        CodeLimits(timeout_s=float("nan"))
    with pytest.raises(ValueError, match="memory_mb"):
        CodeLimits(memory_mb=0)
    with pytest.raises(ValueError, match="disk_mb"):
        CodeLimits(disk_mb=0)
