"""Accuracy and speed of rewards.math_equal against math-verify 0.9.0, measured in one run.

Prints, in this order: (1) the code verifier's latency per completion on rlvr/Code-v0's bundled
problems, one at a time and a GRPO-sized batch through score_batch (the sandbox's cost, which the math
rows do not have), and one Code-v0 env.step's p50/p99 with the run's cgroups against without them;
(2) single-process throughput and latency percentiles on long responses ending in
\\boxed{}, with the ratio ours / math-verify; (3) accuracy per category on the labelled cases for both,
with false positives / false negatives; (4) math_verifier's two backends (native, math-verify) side by
side, timed before their own accuracy pass: speed through the same hard limit, accuracy and agreement.

    .venv/bin/python bench/verifiers.py [--repeat 1] [--cases bench/data/verifier_cases.jsonl] [--only code|backends]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

try:
    from math_verify import parse, verify
except ModuleNotFoundError as err:
    if err.name != "math_verify":
        raise
    raise SystemExit("bench/verifiers.py compares against math-verify, which is not installed: "
                     "pip install -e '.[bench]' (the dev extra includes it)") from None

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from rewards import math_verifier, score_batch  # noqa: E402
from rewards.code import code_verifier  # noqa: E402

CODE_PROBLEMS = Path(__file__).resolve().parents[1] / "rlvr_env" / "tasks" / "code_problems.jsonl"

CASES = Path(__file__).parent / "data" / "verifier_cases.jsonl"

# A solution's working, with numbers that must not be taken as the answer.
WORKING = (
    "We begin by writing the condition as an equation. Let $n$ be the number of steps; the quantity starts at $17$ "
    "and grows by $3$ per step, so after $n$ steps it equals $17 + 3n$. For $n = 4$ this gives $17 + 12 = 29$. "
    "The second condition halves the value whenever it is even, so we track parity: $29$ is odd, $32/2 = 16$ is "
    "even, and the sequence continues $a_1 = 20$, $a_2 = 23$, $a_3 = 26$. Checking the identity "
    "$\\frac{a_{n+1} - a_n}{3} = 1$ for each $n$ confirms the pattern, and substituting back into the original "
    "equation $x^2 - 5x + 6 = 0$ gives the roots $x = 2$ and $x = 3$, of which only one satisfies the constraint.\n\n"
)


def math_verify_equal(pred: str, gold: str) -> bool:
    # math-verify's documented convention: a LaTeX gold goes in $...$ (it scores better than bare gold here)
    wrapped = gold if "$" in gold or "\\boxed" in gold else f"${gold}$"
    return bool(verify(parse(wrapped), parse(pred)))


def ours_equal(pred: str, gold: str) -> bool:
    return math_verifier(pred, answer=gold).score == 1.0


def load_cases(path: Path = CASES) -> list[dict]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def accuracy_table(cases: list[dict]) -> None:
    stats = {name: defaultdict(lambda: [0, 0, 0, 0]) for name in ("ours", "math-verify")}  # right, total, FP, FN
    for case in cases:
        for name, equal in (("ours", ours_equal), ("math-verify", math_verify_equal)):
            got = equal(case["pred"], case["gold"])
            for key in (case["category"], "ALL"):
                row = stats[name][key]
                row[0] += got == case["equal"]
                row[1] += 1
                row[2] += got and not case["equal"]
                row[3] += case["equal"] and not got
    categories = sorted({c["category"] for c in cases}) + ["ALL"]
    print(f"{'category':18} {'n':>4} | {'ours acc':>8} {'FP':>3} {'FN':>3} | {'math-verify acc':>15} {'FP':>3} {'FN':>3}")
    print("-" * 70)
    for category in categories:
        o, m = stats["ours"][category], stats["math-verify"][category]
        print(f"{category:18} {o[1]:4d} | {o[0] / o[1]:8.1%} {o[2]:3d} {o[3]:3d} | {m[0] / m[1]:15.1%} {m[2]:3d} {m[3]:3d}")


def long_responses(cases: list[dict]) -> list[tuple[str, str]]:
    """Every short case as a ~1.6 kB solution ending in \\boxed{pred}: what a policy emits during RL."""
    short = [c for c in cases if "\\boxed" not in c["pred"] and "\n" not in c["pred"] and len(c["pred"]) < 80]
    return [(WORKING * 2 + f"Therefore the answer is $\\boxed{{{c['pred']}}}$.", c["gold"]) for c in short]


def time_one(equal, pairs: list[tuple[str, str]], repeat: int) -> tuple[float, float, float]:
    latencies = []
    for _ in range(repeat):
        for pred, gold in pairs:
            start = time.perf_counter()
            equal(pred, gold)
            latencies.append(time.perf_counter() - start)
    latencies.sort()
    throughput = len(latencies) / sum(latencies)
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    return throughput, p50 * 1e3, p99 * 1e3


def speed_table(cases: list[dict], repeat: int) -> None:
    pairs = long_responses(cases)
    for equal in (ours_equal, math_verify_equal):  # warm-up on other input: imports, our worker process
        equal("\\boxed{\\sqrt{3}+x}", "x+\\sqrt{3}")
    ours = time_one(ours_equal, pairs, repeat)
    reference = time_one(math_verify_equal, pairs, repeat)
    print(f"{len(pairs)} long responses (~{len(pairs[0][0])} chars, ending in \\boxed{{}}), x{repeat}, one process")
    print(f"{'verifier':12} {'checks/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    for name, (throughput, p50, p99) in (("ours", ours), ("math-verify", reference)):
        print(f"{name:12} {throughput:10.0f} {p50:8.2f} {p99:8.2f}")
    print(f"throughput ratio ours / math-verify: {ours[0] / reference[0]:.1f}x")


def backend_table(cases: list[dict], repeat: int) -> None:
    """math_verifier's two backends on the labelled cases: accuracy, FP/FN, how often they agree, and their speed
    on the long responses (the math-verify backend pays a worker round trip per check: its hard limit)."""
    native = lambda pred, gold: math_verifier(pred, answer=gold).score == 1.0  # noqa: E731
    hf = lambda pred, gold: math_verifier(pred, answer=gold, backend="math-verify").score == 1.0  # noqa: E731
    pairs = long_responses(cases)
    for equal in (native, hf):  # warm-up on other input, as speed_table's: imports, the worker process
        equal("\\boxed{\\sqrt{3}+x}", "x+\\sqrt{3}")
    speed = {name: time_one(equal, pairs, repeat) for name, equal in (("native", native), ("math-verify", hf))}
    rows = {"native": [0, 0, 0], "math-verify": [0, 0, 0]}  # right, FP, FN
    agree = 0
    for case in cases:
        verdicts = {name: equal(case["pred"], case["gold"]) for name, equal in (("native", native), ("math-verify", hf))}
        agree += verdicts["native"] == verdicts["math-verify"]
        for name, got in verdicts.items():
            rows[name][0] += got == case["equal"]
            rows[name][1] += got and not case["equal"]
            rows[name][2] += case["equal"] and not got
    print(f"math_verifier backends on {len(cases)} labelled cases; speed on {len(pairs)} long responses x{repeat}")
    print(f"{'backend':12} {'accuracy':>8} {'FP':>3} {'FN':>3} {'checks/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for name, (right, fp, fn) in rows.items():
        throughput, p50, p99 = speed[name]
        print(f"{name:12} {right / len(cases):8.1%} {fp:3d} {fn:3d} {throughput:9.0f} {p50:8.2f} {p99:8.2f}")
    print(f"the backends agree on {agree / len(cases):.1%} of the cases")


def percentiles(latencies: list[float]) -> tuple[float, float]:
    """(p50, p99) of ``latencies`` in milliseconds."""
    ordered = sorted(latencies)
    return statistics.median(ordered) * 1e3, ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3


def code_table(repeat: int, group: int = 8) -> None:
    """Per-completion latency of the code verifier on the bundled gold solutions: sequential, then
    ``group`` completions per problem scored together by score_batch (a GRPO step's shape)."""
    rows = [json.loads(line) for line in CODE_PROBLEMS.read_text().splitlines() if line.strip()]
    pairs = [(f"```python\n{row['code']}\n```", {"tests": row["test_list"], "setup": row.get("test_setup_code") or ""})
             for row in rows]
    code_verifier(*pairs[0][:1], answer=pairs[0][1])  # first run: probes the sandbox, warms the page cache
    latencies, scores = [], []
    for _ in range(repeat):
        for completion, answer in pairs:
            start = time.perf_counter()
            scores.append(code_verifier(completion, answer=answer).score)
            latencies.append(time.perf_counter() - start)
    p50, p99 = percentiles(latencies)
    isolation = code_verifier(*pairs[0][:1], answer=pairs[0][1]).details.get("isolation")
    print(f"code verifier ({isolation}), {len(pairs)} gold solutions x {repeat}: mean score {statistics.mean(scores):.3f}")
    print(f"{'mode':28} {'completions':>11} {'p50 ms':>8} {'p99 ms':>8} {'ms/completion':>14}")
    print(f"{'one at a time':28} {len(latencies):11d} {p50:8.1f} {p99:8.1f} {statistics.mean(latencies) * 1e3:14.1f}")
    batch = [pair for pair in pairs for _ in range(group)]
    start = time.perf_counter()
    results = score_batch([c for c, _ in batch], [a for _, a in batch], verifier=code_verifier, timeout=30)
    elapsed = time.perf_counter() - start
    assert all(r.score == 1.0 for r in results), [r for r in results if r.score != 1.0][:2]
    mode = f"score_batch, {group} per problem"
    print(f"{mode:28} {len(batch):11d} {'':>8} {'':>8} {elapsed / len(batch) * 1e3:14.1f}")


def code_step_table(repeat: int) -> None:
    """p50/p99 of one rlvr/Code-v0 ``env.step`` with a correct program, the run in its pids and memory cgroups
    against the same run without them (``cgroup_roots`` emptied), alternated pass by pass in this process."""
    import gymnasium as gym

    import rlvr_env  # noqa: F401  (registers rlvr/Code-v0)
    from rewards import run_cgroup

    env = gym.make("rlvr/Code-v0")
    task = env.unwrapped.task
    golds = [task.gold_completion(task.problem(index, 0)) for index in range(task.size)]
    with_cgroups = run_cgroup.cgroup_roots()
    latencies: dict[str, list[float]] = {"without cgroups": [], "with cgroups": []}
    for _ in range(repeat + 1):  # the first pass warms the page cache and the rewards worker, and is dropped
        for mode, times in latencies.items():
            run_cgroup.cgroup_roots = (lambda: {}) if mode == "without cgroups" else (lambda: with_cgroups)
            for index, gold in enumerate(golds):
                env.reset(seed=0, options={"problem_index": index})
                start = time.perf_counter()
                reward = env.step(gold)[1]
                times.append(time.perf_counter() - start)
                assert reward == 1.0, (index, mode)
    controllers = ", ".join(sorted(with_cgroups)) or "none can be made here"
    print(f"rlvr/Code-v0 env.step, a correct program, {len(golds)} problems x {repeat} (cgroups: {controllers})")
    print(f"{'mode':18} {'p50 ms':>8} {'p99 ms':>8}")
    summary = {}
    for mode, times in latencies.items():
        summary[mode] = percentiles(times[len(golds):])
        print(f"{mode:18} {summary[mode][0]:8.1f} {summary[mode][1]:8.1f}")
    base, cgroups = summary["without cgroups"], summary["with cgroups"]
    print(f"{'ratio':18} {cgroups[0] / base[0]:8.2f} {cgroups[1] / base[1]:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1,
                        help="passes over the long responses when timing (later passes hit both libraries' caches)")
    parser.add_argument("--cases", type=Path, default=CASES, help="labelled cases (jsonl), default %(default)s")
    parser.add_argument("--only", choices=("code", "backends"), help="only the code verifier's or the backends' table")
    args = parser.parse_args()
    if args.only != "backends":
        code_table(max(args.repeat, 5))
        print()
        code_step_table(max(args.repeat, 10))
    if args.only == "code":
        return
    print()
    cases = load_cases(args.cases)
    if args.only != "backends":
        print(f"{len(cases)} labelled cases ({sum(c['equal'] for c in cases)} equal, "
              f"{sum(not c['equal'] for c in cases)} not equal) from {args.cases.name}\n")
        speed_table(cases, args.repeat)  # first, so neither library's caches are warm from an accuracy pass
        print()
        accuracy_table(cases)
        print()
    backend_table(cases, args.repeat)  # last: its timing would find the caches the tables above warmed alike


if __name__ == "__main__":
    main()
