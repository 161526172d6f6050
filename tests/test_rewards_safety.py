"""Model output is hostile input: every check ends within its limit and never raises."""

import asyncio
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewards import STATUSES, math_equal, math_verifier, score_batch
from rewards.sandbox import WORKERS, CheckTimeout, run_limited

LIMIT_S = 2.0
SLACK_S = 3.0  # worker kill and restart on a loaded 2-core CI machine

HOSTILE = [
    "\\boxed{9^{9^{9^9}}}",
    "\\boxed{10^{10^{10}}!}",
    "\\boxed{(10^{10^{10}})!}",
    "\\boxed{2^{2^{2^{2^{2^{2^{2}}}}}}}",
    "\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",
    "\\boxed{" + "(" * 3000 + "x" + ")" * 3000 + "}",
    "x" * 1_000_000,
    "\\boxed{" + "1" * 1_000_000 + "}",
    "\\boxed{" + "1+" * 400 + "1}",
    "\\boxed{__import__('os').system('touch /tmp/rewards_pwned')}",
    "\\boxed{\\frac{1}{0}}",
    "\\boxed{0^{-1}}",
    "\\boxed{\\sqrt[0]{2}}",
    "\\boxed{\u00e9\u6f22\u5b57\U0001F600 \u2212\u221e}",
    "\\boxed{\x00\x01\x02}",
    "\\boxed{1e99999}",
    "\\boxed{10^{99999}}",
    "\\boxed{x^{x^{x^{x^{x}}}}-y}",
    "\\boxed{\\sin(10^{10^{5}})}",
    "\\boxed{" + "\\sqrt{" * 500 + "2" + "}" * 500 + "}",
]


@pytest.mark.parametrize("completion", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_input_gets_a_status_within_the_limit(completion):
    start = time.monotonic()
    result = math_verifier(completion, answer="2", timeout=LIMIT_S)
    assert result.status in STATUSES
    assert result.score in (0.0, 1.0)
    assert time.monotonic() - start < LIMIT_S + SLACK_S


def _hang(seconds):
    time.sleep(seconds)  # stands in for sympy stuck in C: only a kill ends it
    return "finished"


def _big_power():
    return len(str(9 ** (9 ** 9)))  # minutes of GMP work in C and str()


def test_limit_holds_on_code_stuck_in_c_and_does_not_touch_sigalrm():
    handler = signal.getsignal(signal.SIGALRM)
    start = time.monotonic()
    with pytest.raises(CheckTimeout):
        run_limited(_big_power, (), 0.5)
    assert time.monotonic() - start < 0.5 + SLACK_S
    assert signal.getsignal(signal.SIGALRM) is handler
    assert run_limited(_hang, (0,), 5.0) == "finished"  # a fresh worker replaces the killed one


def test_limit_holds_from_threads_and_asyncio():
    results = []

    def check():
        start = time.monotonic()
        try:
            run_limited(_hang, (30,), 0.5)
        except CheckTimeout:
            results.append(time.monotonic() - start)

    threads = [threading.Thread(target=check) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 2 and max(results) < 0.5 + SLACK_S

    async def in_event_loop():
        return await asyncio.to_thread(math_verifier, "\\boxed{9^{9^{9^9}}}", answer="3", timeout=0.5)

    assert asyncio.run(in_event_loop()).status in ("error", "timeout")
    assert math_equal("\\boxed{x^2-1}", "(x-1)(x+1)")  # the blocking form works inside a loop's thread too


def _quick():
    return "answered"


class _PipeThenLoseTheCore:
    """A worker's stdin whose writer is descheduled right after each write, as a loaded machine does."""

    def __init__(self, pipe):
        self.pipe = pipe

    def write(self, data):
        written = self.pipe.write(data)
        time.sleep(0.3)
        return written

    def __getattr__(self, name):
        return getattr(self.pipe, name)


def test_the_limit_counts_from_before_the_request_is_sent(monkeypatch):
    """The deadline was taken after the request's write: on a loaded 2-core machine the worker that the write woke
    answered while the caller waited for a core, and a check at a 1 us limit came back "ok" (CI, AMD EPYC)."""
    assert run_limited(_quick, (), 5.0) == "answered"  # a worker is up and idle: the next call takes it
    worker = WORKERS._idle[-1]
    monkeypatch.setattr(worker.process, "stdin", _PipeThenLoseTheCore(worker.process.stdin))
    with pytest.raises(CheckTimeout):
        run_limited(_quick, (), 0.1)
    assert not worker.alive  # killed at its deadline, never reused
    assert run_limited(_quick, (), 5.0) == "answered"


def _verify_in_child(completion):
    result = math_verifier(completion, answer="(x-1)(x+1)", timeout=1.0)
    return result.score, result.status


def test_limit_holds_from_a_daemonic_pool_worker():
    # multiprocessing.Pool workers are daemonic and may not fork children; subprocess workers still start
    with get_context("spawn").Pool(1) as pool:
        assert pool.apply(_verify_in_child, ("\\boxed{x^2-1}",)) == (1.0, "ok")
        score, status = pool.apply(_verify_in_child, ("\\boxed{2^{2^{2^{2^{2^{2^{2}}}}}}}",))
        assert score == 0.0 and status in ("error", "timeout")
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as executor:
        assert executor.submit(_verify_in_child, "\\boxed{(x+1)(x-1)}").result(timeout=60) == (1.0, "ok")


def test_hostile_objects_never_leave_the_worker():
    # the reply is JSON: an unpicklable, str()-hostile result comes back as a type name
    assert run_limited(_make_big_sympy_object, (), 5.0) == "<Pow>"


def _make_big_sympy_object():
    import sympy

    return sympy.Pow(9, sympy.Pow(9, 9, evaluate=False), evaluate=False)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(list("0123456789+-*/^_{}()[]\\,.=<>!% xe") + [
    "\\frac", "\\sqrt", "\\boxed{", "\\pi", "\\infty", "\\pm", "\\begin{pmatrix}", "\\end{pmatrix}", "&"]),
    max_size=40).map("".join))
def test_fuzz_never_raises(text):
    start = time.monotonic()
    result = math_verifier(text, answer="1", timeout=LIMIT_S)
    assert result.status in STATUSES
    assert time.monotonic() - start < LIMIT_S + SLACK_S


_OPERAND = st.sampled_from(["x", "z", "2", "-1", "1+1", "3+3", "\\frac{1}{2}", "\\sqrt{2}", "(1,2)", "[0,1)", "\\infty"])
_RELATION = st.sampled_from(["=", "<", ">", "\\le", "\\geq", "\\ne", "<=", "!="])


@st.composite
def _relation_chains(draw):
    """'z = 1 + 1 = 2', '1 < x \\le 3 = y': chains of any length mixing equalities and inequalities."""
    parts = [draw(_OPERAND)]
    for _ in range(draw(st.integers(1, 4))):
        parts += [draw(_RELATION), draw(_OPERAND)]
    text = " ".join(parts)
    return draw(st.sampled_from([text, f"${text}$", f"\\boxed{{{text}}}"]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_relation_chains(), _relation_chains())
def test_fuzz_relation_chains_never_raise(pred, gold):
    result = math_verifier(pred, answer=gold, timeout=LIMIT_S)
    assert result.status in STATUSES and result.status != "error", result


@pytest.mark.parametrize("pred,gold", [
    ("$z = 3+3 = 2$", "z = 1 + 1 = 2"),  # an equality chain once crashed the in-process interval check
    ("$a = b < c$", "a < b = c"),
    ("1 < x = 2", "1 < x \\le 2"),
])
def test_relation_chains_are_checked_not_raised(pred, gold):
    assert math_verifier(pred, answer=gold).status == "ok"


@pytest.mark.parametrize("completion", [
    "\\boxed{-" + "\\pm" * 20 + " 1}",  # once 2^20 paths through a shared subtree: 43 s and 374 MB in-process
    "\\boxed{" + "\\sqrt{1 \\pm " * 16 + "1" + "}" * 16 + "}",  # once 9.8 s
])
def test_plus_minus_bombs_are_refused_quickly(completion):
    start = time.monotonic()
    result = math_verifier(completion, answer="5", timeout=LIMIT_S)
    assert (result.score, result.status, result.details["method"]) == (0.0, "ok", "unparsed")
    assert result.details["reason"] == "too many \\pm"
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("pred,gold,score", [
    # a value with \pm in it is the set of its values, also inside an expression and in a list
    ("x = \\frac{1 \\pm \\sqrt{5}}{2}", "\\frac{1+\\sqrt5}{2}, \\frac{1-\\sqrt5}{2}", 1.0),
    ("2(1\\pm\\sqrt{2})", "2\\pm 2\\sqrt{2}", 1.0),
    ("\\pm 1, \\pm 2", "1, -1, 2, -2", 1.0),
    ("\\pm\\sqrt{2 \\pm \\sqrt{3}}", "\\sqrt{2+\\sqrt3}, -\\sqrt{2+\\sqrt3}, \\sqrt{2-\\sqrt3}, -\\sqrt{2-\\sqrt3}", 1.0),
    # two values never answer one: once a "not a scalar" error status
    ("\\frac{1 \\pm \\sqrt{5}}{2}", "\\frac{1+\\sqrt5}{2}", 0.0),
    ("2(1\\pm\\sqrt3)", "2+2\\sqrt3", 0.0),
    # arithmetic on a container or an equation has no value: once a "not a scalar" error status
    ("f(1,2)", "f(2,1)", 0.0),
    ("2(1,2)", "x", 0.0),
    ("\\frac{x=1}{2}", "x", 0.0),
])
def test_plus_minus_and_containers_in_arithmetic_are_scored_not_errors(pred, gold, score):
    result = math_verifier("\\boxed{" + pred + "}", answer=gold)
    assert (result.score, result.status) == (score, "ok")


def test_a_long_run_of_signs_hits_the_parser_depth_guard():
    # 501 minus signs once passed the parser and hit Python's recursion limit later: an error status
    result = math_verifier("\\boxed{" + "-" * 501 + "x}", answer="-x")
    assert (result.score, result.status, result.details["method"]) == (0.0, "ok", "unparsed")
    assert result.details["reason"] == "nesting too deep"


def test_an_internal_error_is_a_status_not_an_exception(monkeypatch):
    import rewards.mathcheck

    def broken(*args):
        raise ValueError("bug in the checker")

    monkeypatch.setattr(rewards.mathcheck, "equivalent", broken)
    result = math_verifier("\\boxed{0.5}", answer="3/4")  # integers are decided before `equivalent`
    assert (result.score, result.status) == (0.0, "error") and "ValueError" in result.details["reason"]


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60), st.text(max_size=20))
def test_fuzz_unicode_never_raises(pred, gold):
    assert math_verifier(pred, answer=gold, timeout=LIMIT_S).status in STATUSES


def test_score_batch_marks_a_hanging_verifier_as_timeout():
    from rewards import format_reward

    catastrophic = format_reward(pattern=r"^(a+)+$")  # exponential backtracking inside the C regex engine
    start = time.monotonic()
    results = score_batch(["a" * 40 + "b", "aaa"], [None, None], verifier=catastrophic, workers=2, timeout=1.0)
    assert [r.status for r in results] == ["timeout", "ok"]
    assert results[1].score == 1.0
    assert time.monotonic() - start < 1.0 + SLACK_S + 2.0


def teardown_module():
    WORKERS.shutdown()


def test_the_verifier_pool_shares_the_cores_among_the_ranks_of_a_machine(monkeypatch):
    from rewards import batch

    monkeypatch.setattr(batch.os, "cpu_count", lambda: 16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert batch.default_workers() == 8  # at most 8 on one process
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun --nproc_per_node=4: 4 cores for each rank's pool
    assert batch.default_workers() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert batch.default_workers() == 1
