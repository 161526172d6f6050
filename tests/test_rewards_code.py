"""rewards.code: the code verifier and its sandbox, hostile programs included, from threads, asyncio and workers."""

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rewards import score_batch
from rewards.code import CodeLimits, CodeVerifier, code_verifier, extract_code, namespace_command, run_code

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 5"]
SOLUTION = "def add(a, b):\n    return a + b\n"
FAST = CodeLimits(timeout_s=3.0, cpu_s=2)


def test_score_is_the_fraction_of_tests_passed():
    run = run_code(SOLUTION + "print('working')", TESTS)
    assert (run.status, run.passed, run.total, run.score) == ("ok", 2, 3, pytest.approx(2 / 3))
    assert run.output == "working\n" and run.test_errors == ("test 2: AssertionError: ",)


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


# Every hostile program: a status, score 0, the caller unharmed, nothing left running.
HOSTILE = {
    "infinite loop": ("while True:\n    pass", "timeout"),
    "sleep forever": ("import time\ntime.sleep(1000)", "timeout"),
    "fork bomb": ("import os\nwhile True:\n    os.fork()", "error"),
    "subprocess": ("import subprocess\nsubprocess.run(['sleep', '100'])", "error"),
    "huge allocation": ("x = bytearray(10 ** 11)", "error"),
    "kill the parent": ("import os\nos.kill(PARENT, 9)", "error"),
    "kill the group": ("import os\nos.killpg(0, 9)", "error"),
    "write outside": ("open(OUTSIDE, 'w').write('escaped')", "error"),
    "delete outside": ("import os\nos.remove(OUTSIDE_EXISTING)", "error"),
    "network": ("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)", "error"),
    "ctypes": ("import ctypes\nctypes.CDLL(None).kill(PARENT, 9)", "error"),
    "exit without tests": ("import os\nos._exit(0)", "error"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_programs_get_a_status_and_nothing_escapes(name, tmp_path):
    code, status = HOSTILE[name]
    outside, existing = tmp_path / "escaped.txt", tmp_path / "keep.txt"
    existing.write_text("keep")
    values = {"PARENT": os.getpid(), "OUTSIDE": str(outside), "OUTSIDE_EXISTING": str(existing)}
    preamble = "".join(f"{key} = {value!r}\n" for key, value in values.items())
    start = time.monotonic()
    run = run_code(preamble + code + "\ndef add(a, b):\n    return a + b", TESTS[:1], limits=FAST)
    assert run.status == status, run
    assert run.score == 0.0 and time.monotonic() - start < FAST.timeout_s + 3
    assert not outside.exists() and existing.read_text() == "keep"
    assert run_code(SOLUTION, TESTS[:1]).score == 1.0  # the caller and the next run are fine


def test_output_is_capped_and_files_stay_in_the_working_directory():
    run = run_code("print('x' * 10 ** 7)\nopen('mine.txt', 'w').write('ok')", [], limits=CodeLimits(output_chars=100))
    assert len(run.output) == 100 and "File too large" in run.reason
    assert run_code("open('mine.txt', 'w').write('ok')\nprint(open('mine.txt').read())").output == "ok\n"


def test_isolation_is_reported():
    assert run_code("pass").isolation == ("namespaces" if namespace_command() else "rlimits")
    assert run_code("pass", limits=CodeLimits(isolate=False)).isolation == "rlimits"
    # without namespaces the audit hook and the rlimits still hold
    assert run_code("import os\nos.kill(1, 9)", limits=CodeLimits(isolate=False)).status == "error"
    assert run_code("while True: pass", limits=CodeLimits(isolate=False, timeout_s=2, cpu_s=1)).status == "timeout"


def test_from_threads_asyncio_and_worker_processes():
    completions = [f"```python\n{SOLUTION}```", "```python\nwhile True: pass\n```", "nothing"] * 2
    expected = [("ok", 2 / 3), ("timeout", 0.0), ("no_answer", 0.0)] * 2
    verifier = CodeVerifier(FAST)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda c: verifier(c, answer=TESTS), completions))
    assert [(r.status, pytest.approx(r.score)) for r in results] == expected

    async def score_all():
        return await asyncio.gather(*(asyncio.to_thread(verifier, c, answer=TESTS) for c in completions))

    assert [(r.status, pytest.approx(r.score)) for r in asyncio.run(score_all())] == expected
    batch = score_batch(completions, [TESTS] * len(completions), verifier=verifier, workers=2, timeout=FAST.timeout_s + 5)
    assert [(r.status, pytest.approx(r.score)) for r in batch] == expected


def test_limits_are_validated():
    with pytest.raises(ValueError, match="timeout_s"):
        CodeLimits(timeout_s=float("nan"))
    with pytest.raises(ValueError, match="memory_mb"):
        CodeLimits(memory_mb=0)
